"""The automatic quant against real files (issue 51, points 1 and 2): the local Hugging Face-compatible endpoint
serves five real quants of SmolLM2 made with the pinned llama-quantize (Q2_K, Q4_K_M, Q6_K, Q8_0, F16), and a
directory holds the same files. huggingface_hub talks to the endpoint unmodified; the headers of the quants not
taken are read by HTTP ranges, never downloaded whole.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gguf_provider import cli
from gguf_provider.langchain import ChatGGUF
from gguf_provider.runtime import ModelRef, default
from gguf_provider.runtime._memory import choose
from tests.support.hf_endpoint import FixtureFiles, HFEndpoint
from tests.support.hf_repos import AUTO
from tests.support.runtime import RuntimeEnv

LABELS = ["Q2_K", "Q4_K_M", "Q6_K", "Q8_0", "F16"]  # by size, as the fixture files are
STEM = "SmolLM2-135M-Instruct"


def _gets(hub: HFEndpoint) -> dict[str, list[str]]:
    """Each file's GET requests: the Range asked for, or "" for the whole file."""
    out: dict[str, list[str]] = {}
    for r in hub.requests:
        if r.method == "GET" and f"/{AUTO}/resolve/" in r.path:
            out.setdefault(r.path.rsplit("/", 1)[-1], []).append(r.headers.get("range", ""))
    return out


def _ranges_end_below(asked: list[str], limit: int) -> bool:
    ends = [re.fullmatch(r"bytes=(\d+)-(\d+)", a) for a in asked]
    return all(m is not None and int(m[2]) < limit for m in ends)


def test_a_repo_without_a_quant_gets_the_one_this_machine_should_run(
        hub: HFEndpoint, files: FixtureFiles, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    choose._SAID.clear()
    seen = default().devices()
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(tmp_path / "home"))  # no headers kept from an earlier run
    got = default().resolve(ModelRef(AUTO)).model
    gets = _gets(hub)
    assert got.quant in LABELS and got.chosen is not None and got.chosen.startswith(f"{AUTO}: {got.quant} (")
    if not any(d.kind != "cpu" for d in seen.devices):  # this machine computes on its CPU: the CPU rule
        assert got.quant == choose.CPU_BEST and "in RAM" in got.chosen
    # Said once on stderr, where a person at a terminal or notebook sees it.
    assert f"gguf-provider: {got.chosen}" in capsys.readouterr().err
    # The file taken was downloaded whole; each other quant only had its header and tensor table read by ranges.
    name = got.path.name
    assert "" in gets[name]
    others = {f"{STEM}-{q}.gguf" for q in LABELS} - {name}
    assert set(gets) == others | {name}
    for other in others:
        assert gets[other] and _ranges_end_below(gets[other], 8 << 20), (other, gets[other])
    # The headers read are kept (by content hash): the next start asks the Hub for none of them again.
    hub.requests.clear()
    again = default().resolve(ModelRef(AUTO)).model
    assert again.path == got.path and not any(r for v in _gets(hub).values() for r in v if r), _gets(hub)


def test_plan_lists_every_quant_and_marks_auto_without_downloading(
        hub: HFEndpoint, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["plan", AUTO, "--device", "cuda:1GiB", "--device", "cpu:8GiB", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and [q["quant"] for q in out["quants"]] == LABELS
    assert [q["quant"] for q in out["quants"] if q["picked"]] == [out["auto"]]
    # 1 GiB keeps llama.cpp's 1 GiB --fit-target free: no quant fits the card whole, the CPU rule picks.
    assert out["rule"] == "cpu" and out["auto"] == choose.CPU_BEST
    assert all(q["fits"] and not q["on_gpu"] for q in out["quants"])
    assert all(_ranges_end_below(v, 8 << 20) for v in _gets(hub).values())  # headers only: nothing downloaded
    # A card that holds even F16 whole: the best quality, on it.
    rc = cli.main(["plan", AUTO, "--device", "cuda:2GiB", "--device", "cpu:8GiB", "--json"])
    out = json.loads(capsys.readouterr().out)
    picked = next(q for q in out["quants"] if q["picked"])
    assert rc == 0 and out["rule"] == "gpu" and picked["quant"] == "F16" and picked["on_gpu"]
    assert picked["layers"] == {"CUDA0": 31}  # 30 layers and the output head
    # A named quant plans that file alone (the single-plan output), as before.
    rc = cli.main(["plan", AUTO, "--quant", "Q2_K", "--device", "cpu:8GiB", "--json"])
    assert rc == 0 and "quants" not in json.loads(capsys.readouterr().out)


def test_a_directory_of_quants_starts_the_chosen_one(rt: RuntimeEnv, files: FixtureFiles, tmp_path: Path) -> None:
    folder = tmp_path / "smollm2"
    folder.mkdir()
    for q in LABELS:
        (folder / f"{STEM}-{q}.gguf").symlink_to(files.quants[q])
    expected = default().resolve(ModelRef(str(folder))).model
    chat = ChatGGUF(model=str(folder))  # defaults: the chat models' own
    try:
        reply = chat.invoke("Say hello.", max_tokens=8)
        assert isinstance(reply.content, str) and reply.content
        assert Path(chat.engine.info.model).name == expected.path.name and expected.quant in LABELS
    finally:
        chat.engine.unload()


def test_offline_the_cached_quants_are_chosen_among(hub: HFEndpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    for q in ("Q2_K", "Q8_0"):
        default().resolve(ModelRef(AUTO, quant=q))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    got = default().resolve(ModelRef(AUTO, choose=choose.chooser(devices=[_cpu(8)]))).model
    # Of what the cache holds, the best up to Q4_K_M: Q2_K (Q8_0 is above it); read from disk, no request.
    assert got.quant == "Q2_K" and got.cached and got.chosen and "Q2_K" in got.chosen


def _cpu(gib: int) -> choose.Device:
    return choose.Device("CPU", "cpu", "host RAM", gib << 30, gib << 30)
