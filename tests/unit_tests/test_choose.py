"""The automatic quant (issue 51, point 1) and `plan` over every quant (point 2): runtime/_memory/choose.py on
Qwen2.5-Coder-0.5B's real tensor table written in several quants (sparse files: the sizes are the real ones, the
bytes are not there), planned on devices as users name them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gguf_provider import cli
from gguf_provider.errors import InsufficientMemoryError
from gguf_provider.runtime import ModelRef, default
from gguf_provider.runtime._common.gguf import read_tables
from gguf_provider.runtime._memory import choose, devices
from gguf_provider.runtime._memory.choose import CPU_BEST, QUALITY, Option
from gguf_provider.runtime._memory.plan import FIT_MIN_CONTEXT, FIT_TARGET, MiB
from tests.support.gguf_tables import F16, F32, Q2_K, Q4_K, Q6_K, Q8_0, QWEN_META, qwen_tensors, write_gguf

# label -> (ggml type of every weight, llama_ftype written in general.file_type)
QUANTS = {"Q2_K": (Q2_K, 10), "Q4_K_M": (Q4_K, 15), "Q6_K": (Q6_K, 18), "Q8_0": (Q8_0, 7), "F16": (F16, 1)}
STEM = "Qwen2.5-Coder-0.5B-Instruct"


def write_quant(folder: Path, label: str, *, holds: str | None = None) -> Path:
    """Qwen2.5-Coder-0.5B as ``label`` (its file name); ``holds``: the quant really inside, when it lies."""
    ggml, ftype = QUANTS[holds or label]
    tensors = [(n, shape, t if t == F32 else ggml) for n, shape, t in qwen_tensors()]
    return write_gguf(folder / f"{STEM}-{label}.gguf", {**QWEN_META, "general.file_type": ftype}, tensors)


@pytest.fixture
def quants(tmp_path: Path) -> Path:
    folder = tmp_path / "qwen"
    for label in QUANTS:
        write_quant(folder, label)
    return folder


def options(folder: Path) -> list[Option]:
    out = []
    for f in sorted(folder.glob("*.gguf")):
        ((header, tensors),) = read_tables([f])
        out.append(Option(f.stem.rsplit("-", 1)[-1], f.stat().st_size, header, tuple(tensors)))
    return out


def named(*specs: str) -> list[devices.Device]:
    return devices.number_devices([devices.parse_device_arg(s) for s in specs])


def by_label(made: choose.Choice) -> dict[str, choose.Verdict]:
    return {v.option.label: v for v in made.verdicts}


def test_with_a_gpu_the_best_quality_that_fits_it_whole(quants: Path) -> None:
    opts = options(quants)
    sizes = {o.label: o.size for o in opts}
    # Room on the GPU for Q6_K whole, not for Q8_0 even at llama.cpp's fit minimum context (the automatic context
    # shrinks to 4096 before a layer leaves the GPU, as llama.cpp's fit does).
    at_min = choose.choose(STEM, opts, named("cuda:8GiB", "cpu:32GiB"), n_ctx=FIT_MIN_CONTEXT)
    need = {v.option.label: sum(p.total for p in v.plan.placements if p.device.kind != "cpu")
            for v in at_min.verdicts}
    room = (need["Q6_K"] + need["Q8_0"]) // 2
    made = choose.choose(STEM, opts, named(f"cuda:{(FIT_TARGET + room) // MiB}MiB", "cpu:32GiB"))
    v = made.choice
    assert v is not None and v.option.label == "Q6_K" and v.on_gpu and made.rule == "gpu"
    assert not by_label(made)["Q8_0"].on_gpu and not by_label(made)["F16"].on_gpu
    # The line says what was picked, where, at which context, and what the next better quant would need.
    assert made.line().startswith(f"{STEM}: Q6_K ({choose._size(sizes['Q6_K'])}, all 24 layers on CUDA0 at n_ctx ")
    assert "Q8_0 would need " in made.line() and " on CUDA0 (" in made.line()
    # A GPU that holds everything: the best quality, F16 (F32 would rank no higher).
    assert choose.choose(STEM, opts, named("cuda:8GiB", "cpu:32GiB")).choice.option.label == "F16"  # type: ignore[union-attr]


def test_on_a_cpu_the_best_up_to_the_4_bit_k_quant(quants: Path) -> None:
    made = choose.choose(STEM, options(quants), named("cpu:32GiB"))
    assert made.rule == "cpu" and made.choice is not None and made.choice.option.label == CPU_BEST
    assert all(v.plan.fits for v in made.verdicts)  # Q6_K to F16 fit too: the rule, not the memory, says no
    assert "on a CPU the best up to Q4_K_M" in made.line()
    # Without a quant at or below Q4_K_M: the smallest file.
    folder = quants.parent / "big"
    for label in ("Q8_0", "F16"):
        write_quant(folder, label)
    only_big = choose.choose(STEM, options(folder), named("cpu:32GiB"))
    assert only_big.choice is not None and only_big.choice.option.label == "Q8_0"


def test_no_quant_fits_the_gpu_whole_then_the_cpu_rule_over_what_fits(quants: Path) -> None:
    # The acceptance's devices: a 1 GiB card keeps llama.cpp's 1 GiB --fit-target free, so it holds no layer.
    made = choose.choose(STEM, options(quants), named("cuda:1GiB", "cpu:8GiB"))
    assert made.rule == "cpu" and made.choice is not None and made.choice.option.label == CPU_BEST
    assert not any(v.on_gpu for v in made.verdicts)
    assert "no quant fits the GPU whole" in made.line()


def test_never_a_file_that_does_not_fit(quants: Path) -> None:
    opts = options(quants)
    small = min(o.size for o in opts)
    # RAM for Q2_K and a small context, not for anything bigger: the smallest is taken though the rule prefers more.
    ram = f"cpu:{(small + 900 * MiB) * 10 // 9 // MiB + 600}MiB"
    made = choose.choose(STEM, opts, named(ram))
    fitting = [v.option.label for v in made.verdicts if v.plan.fits]
    assert made.choice is not None and made.choice.plan.fits and made.choice.option.label in fitting
    assert "F16" not in fitting
    # Nothing fits: no pick, and the chooser raises the typed error that names each quant's need.
    none = choose.choose(STEM, opts, named("cpu:256MiB"))
    assert none.choice is None and none.rule == "none" and "does not fit" in none.line()
    pick = choose.chooser(devices=named("cpu:256MiB"))
    files = [_file(o) for o in opts]
    with pytest.raises(InsufficientMemoryError, match="no quant fits this machine") as err:
        pick(STEM, files)
    assert "Q2_K" in str(err.value) and "smaller n_ctx" in str(err.value)


def _file(o: Option) -> choose.QuantFile:
    return choose.QuantFile(o.label, o.size, (o.label,), lambda: [(o.header, list(o.tensors))])


def test_a_file_is_judged_by_what_it_holds_not_its_name(tmp_path: Path) -> None:
    folder = tmp_path / "odd"
    write_quant(folder, "Q4_K_M")
    write_quant(folder, "Q8_0", holds="Q2_K")  # named Q8_0, holds Q2_K: ranks below Q4_K_M
    made = choose.choose(STEM, options(folder), named("cpu:32GiB"))
    assert {v.option.label: v.option.quant for v in made.verdicts} == {"Q4_K_M": "Q4_K_M", "Q8_0": "Q2_K"}
    assert made.choice is not None and made.choice.option.label == "Q4_K_M"
    assert QUALITY.index("Q2_K") < QUALITY.index("Q4_K_M") < QUALITY.index("Q8_0") < QUALITY.index("F16")


def test_a_directory_resolves_to_the_choice_and_says_it(quants: Path, capsys: pytest.CaptureFixture[str]) -> None:
    choose._SAID.clear()
    got = default().resolve(ModelRef(str(quants), choose=choose.chooser(devices=named("cpu:32GiB")))).model
    assert got.path.name == f"{STEM}-{CPU_BEST}.gguf" and got.quant == CPU_BEST
    assert got.chosen is not None and got.chosen.startswith(f"{STEM}: {CPU_BEST} (")
    assert capsys.readouterr().err.strip() == f"gguf-provider: {got.chosen}"  # said once, where a person sees it
    default().resolve(ModelRef(str(quants), choose=choose.chooser(devices=named("cpu:32GiB"))))
    assert capsys.readouterr().err == ""  # and not again
    # A named quant is never overridden, even one the planner would not pick; "auto" is the choice.
    assert default().resolve(ModelRef(str(quants), quant="F16")).model.path.name == f"{STEM}-F16.gguf"
    auto = default().resolve(ModelRef(str(quants), quant="auto",
                                      choose=choose.chooser(devices=named("cpu:32GiB")))).model
    assert auto.path == got.path


def test_a_models_dir_name_with_several_quants_is_chosen_too(
        quants: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GGUF_PROVIDER_MODELS", str(quants))
    got = default().resolve(ModelRef(STEM, choose=choose.chooser(devices=named("cpu:32GiB")))).model
    assert got.path.name == f"{STEM}-{CPU_BEST}.gguf" and got.chosen and got.source == "models-dir"


def test_cli_plan_compares_every_quant(quants: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    rc = cli.main(["plan", str(quants), "--device", "cuda:1GiB", "--device", "cpu:8GiB", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert [q["quant"] for q in out["quants"]] == ["Q2_K", "Q4_K_M", "Q6_K", "Q8_0", "F16"]  # by size
    assert [q["quant"] for q in out["quants"] if q["picked"]] == [out["auto"]] == [CPU_BEST]
    for q in out["quants"]:
        assert set(q) >= {"bytes", "fits", "on_gpu", "n_ctx", "layers", "need", "plan"}
        assert set(q["layers"]) <= {"CUDA0", "CPU"}
    rc = cli.main(["plan", str(quants), "--device", "cuda:4GiB", "--device", "cpu:8GiB"])
    text = capsys.readouterr().out
    assert rc == 0
    starred = [line for line in text.splitlines() if line.startswith("*  ")]
    assert len(starred) == 1 and "all 24 layers on CUDA0" in starred[0]
    assert "nothing was downloaded or started" in text
    # Nothing fits: every quant listed, none marked, exit 1.
    rc = cli.main(["plan", str(quants), "--device", "cpu:256MiB", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["auto"] is None and len(out["quants"]) == 5


def test_gguf_plan_in_a_notebook_compares_every_quant(quants: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from IPython.testing import globalipapp

    shell = globalipapp.start_ipython() or globalipapp.get_ipython()  # type: ignore[no-untyped-call]
    shell.run_line_magic("load_ext", "gguf_provider")
    table = shell.run_line_magic("gguf", f"plan {quants} --device cuda:1GiB --device cpu:8GiB")
    rows = table.rows
    assert [r["quant"] for r in rows] == ["Q2_K", "Q4_K_M", "Q6_K", "Q8_0", "F16"]
    assert [r["quant"] for r in rows if r["auto"] == "*"] == [CPU_BEST]
    assert "| auto | quant |" in table._repr_markdown_() and f"auto: {STEM}: {CPU_BEST} (" in table.footer
    shell.run_line_magic("gguf", f"plan {quants} --device cpu:8GiB --json")
    assert json.loads(capsys.readouterr().out)["auto"] == CPU_BEST


def test_n_gpu_layers_0_chooses_for_the_cpu(quants: Path) -> None:
    gpu = named("cuda:8GiB", "cpu:32GiB")
    on_gpu = choose.chooser(devices=gpu, quiet=True)
    on_cpu = choose.chooser(devices=gpu, quiet=True, cpu_only=True)
    files = [_file(o) for o in options(quants)]
    assert files[on_gpu(STEM, files)[0]].label == "F16" and files[on_cpu(STEM, files)[0]].label == CPU_BEST
