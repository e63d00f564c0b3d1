"""resolve_model() for local paths and the models dirs, and the quant/shard rules (offline: the model files are
header-only GGUFs written by the tests; real split sets of llama-gguf-split are in
tests/integration_tests/test_models_split.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gguf_provider.errors import MissingShardError, ModelNotFoundError, UnknownQuantError
from gguf_provider.runtime._models import (
    ModelRef,
    list_local_models,
    parse_quant,
    pull,
    quant_matches,
    resolve,
    resolve_model,
)
from gguf_provider.runtime._models import files as model_files
from tests.support.gguf_bytes import STANDINS, StandIn


@pytest.fixture(scope="session")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GGUF file named like the SmolLM2 test model (local resolution reads names and sizes, not weights)."""
    return STANDINS["smollm2"].write(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="session")
def split_set(tmp_path_factory: pytest.TempPathFactory, model_file: Path) -> tuple[Path, ...]:
    """Three shards named as llama-gguf-split names them (``<prefix>-0000N-of-00003.gguf``)."""
    d = tmp_path_factory.mktemp("split")
    shards = tuple(d / f"SmolLM2-135M-Instruct-Q4_1-{i:05d}-of-00003.gguf" for i in (1, 2, 3))
    for i, p in enumerate(shards):
        p.write_bytes(model_file.read_bytes() + b"\0" * (1000 * i))  # sizes differ: the total is checked
    return shards


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty gguf-provider home (models dir = <tmp>/home/models); the real files stay where they are."""
    h = tmp_path / "home"
    (h / "models").mkdir(parents=True)
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(h))
    monkeypatch.delenv("GGUF_PROVIDER_MODELS", raising=False)
    return h


def _link(target: Path, at: Path) -> Path:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(target)
    return at


# --- pure rules ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("quant, name, expected", [
    ("Q4_K_M", "model-Q4_K_M.gguf", True),
    ("q4_k_m", "model.Q4_K_M.gguf", True),
    ("Q4_K_M", "model-IQ4_K_M.gguf", False),
    ("IQ4_K_M", "model-IQ4_K_M.gguf", True),
    ("F16", "model-BF16.gguf", False),
    ("F16", "mmproj-model-f16.gguf", True),
    ("Q4_K", "model-Q4_K_M.gguf", False),
    ("Q4_0", "model-Q4_0_4_4.gguf", False),
    ("Q4_K_M", "Q4_K_M/model-00001-of-00002.gguf", True),
    ("Q4_K_M", "model_Q4_K_M.gguf", True),
    ("Q4_K_XL", "model-UD-Q4_K_XL.gguf", True),
    ("Q8_0", "model-Q4_K_M.gguf", False),
])
def test_quant_matches(quant: str, name: str, expected: bool) -> None:
    assert quant_matches(quant, name) is expected


@pytest.mark.parametrize("name, expected", [
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
    ("Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf", "Q4_K_M"),
    ("model-IQ4_XS-00001-of-00003.gguf", "IQ4_XS"),
    ("Llama-3-8B-bf16.gguf", "BF16"),
    ("Model-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
    ("no-quant-here.gguf", None),
])
def test_parse_quant(name: str, expected: str | None) -> None:
    assert parse_quant(name) == expected


def test_select_rules() -> None:
    files = {"m-IQ4_K_M.gguf": 10, "m-Q8_0.gguf": 30, "m-Q4_K_M.gguf": 20, "m-Q2_K.gguf": 5, "mmproj-f16.gguf": 1}
    group = model_files._group(files)
    assert model_files._select(group, quant=None, filename=None, where="x").first == "m-Q4_K_M.gguf"
    assert model_files._select(group, quant="iq4_k_m", filename=None, where="x").first == "m-IQ4_K_M.gguf"
    del files["m-Q4_K_M.gguf"]
    assert model_files._select(model_files._group(files), quant=None, filename=None, where="x").first == "m-Q8_0.gguf"
    with pytest.raises(UnknownQuantError) as err:
        model_files._select(model_files._group(files), quant="Q4_K_M", filename=None, where="x")
    assert err.value.available == {"IQ4_K_M": 10, "Q8_0": 30, "Q2_K": 5}
    split = {"d/m-Q4_K_M-00001-of-00003.gguf": 1, "d/m-Q4_K_M-00003-of-00003.gguf": 1, "m-Q8_0.gguf": 9}
    with pytest.raises(MissingShardError, match="00002-of-00003"):
        model_files._select(model_files._group(split), quant="Q4_K_M", filename=None, where="x")
    # an incomplete split set is never a default choice
    assert model_files._select(model_files._group(split), quant=None, filename=None, where="x").first == "m-Q8_0.gguf"



@pytest.mark.parametrize(("quants", "expected"), [
    (["Q8_0", "Q5_K_M", "Q4_K_S", "Q4_K_M", "Q2_K"], "Q4_K_M"),
    (["Q8_0", "Q5_K_M", "Q4_K_S", "Q2_K"], "Q4_K_S"),
    (["Q8_0", "Q5_K_M", "Q2_K", "IQ4_K_S"], "Q5_K_M"),
    (["Q8_0", "Q2_K", "F16"], "Q8_0"),
    (["F16", "Q6_K", "BF16"], "Q6_K"),  # none preferred: the smallest
])
def test_default_quant_preference(quants: list[str], expected: str) -> None:
    sizes = {"Q2_K": 3, "Q4_K_S": 5, "IQ4_K_S": 5, "Q4_K_M": 6, "Q5_K_M": 7, "Q6_K": 8, "Q8_0": 9, "F16": 16,
             "BF16": 16}
    group = model_files._group({f"m-{q}.gguf": sizes[q] for q in quants})
    assert model_files._select(group, quant=None, filename=None, where="x").first == f"m-{expected}.gguf"


# --- local paths -----------------------------------------------------------------------------------------------


def test_path_with_tilde(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_file: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    _link(model_file, tmp_path / "m" / "SmolLM2.Q4_1.gguf")
    m = resolve_model("~/m/SmolLM2.Q4_1.gguf")
    assert m.path == tmp_path / "m" / "SmolLM2.Q4_1.gguf" and m.shards == (m.path,)
    assert m.source == "path" and m.quant == "Q4_1" and m.repo is None and m.mmproj is None
    assert m.size_bytes == model_file.stat().st_size
    assert resolve_model(Path(tmp_path / "m" / "SmolLM2.Q4_1.gguf")) == m  # os.PathLike too


def test_missing_path(home: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model("./nope/model.gguf")


def test_split_set_complete(home: Path, tmp_path: Path, split_set: tuple[Path, ...]) -> None:
    links = [_link(p, tmp_path / "s" / p.name) for p in split_set]
    for given in (links[0], links[1]):  # any shard stands for the whole set
        m = resolve_model(str(given))
        assert m.path == links[0] and m.shards == tuple(links)
        assert m.size_bytes == sum(p.stat().st_size for p in split_set)


def test_split_set_missing_shard(home: Path, tmp_path: Path, split_set: tuple[Path, ...]) -> None:
    _link(split_set[0], tmp_path / "s" / split_set[0].name)
    _link(split_set[2], tmp_path / "s" / split_set[2].name)
    with pytest.raises(MissingShardError) as err:
        resolve_model(str(tmp_path / "s" / split_set[0].name))
    assert split_set[1].name in str(err.value) and split_set[2].name not in str(err.value)


def test_local_vision_mmproj(home: Path, tmp_path: Path, model_file: Path) -> None:
    model = _link(model_file, tmp_path / "v" / "model-Q4_1.gguf")
    with pytest.raises(ModelNotFoundError, match="mmproj"):
        resolve_model(str(model), vision=True)
    _link(model_file, tmp_path / "v" / "mmproj-model-Q8_0.gguf")
    proj = _link(model_file, tmp_path / "v" / "mmproj-model-f16.gguf")
    assert resolve_model(str(model), vision=True).mmproj == proj


# --- models dirs -----------------------------------------------------------------------------------------------


def test_models_dir_by_stem_case_insensitive(home: Path, model_file: Path) -> None:
    link = _link(model_file, home / "models" / model_file.name)
    for spec in ("SmolLM2-135M-Instruct.Q4_1", "smollm2-135m-instruct.q4_1", "SMOLLM2-135M-INSTRUCT.Q4_1.gguf"):
        m = resolve_model(spec)
        assert m.path == link and m.source == "models-dir" and m.quant == "Q4_1"


def test_models_dir_without_quant_suffix(home: Path, model_file: Path) -> None:
    q4 = _link(model_file, home / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert resolve_model("SmolLM2-135M-Instruct").path == q4
    q8 = _link(model_file, home / "models" / "sub" / "SmolLM2-135M-Instruct.Q8_0.gguf")
    with pytest.raises(ModelNotFoundError, match="ambiguous") as err:
        resolve_model("smollm2-135m-instruct")
    assert "SmolLM2-135M-Instruct.Q4_1" in str(err.value) and "SmolLM2-135M-Instruct.Q8_0" in str(err.value)
    assert resolve_model("SmolLM2-135M-Instruct:Q8_0").path == q8
    assert resolve_model("SmolLM2-135M-Instruct", quant="q4_1").path == q4


def test_env_models_dirs(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_file: Path) -> None:
    extra1, extra2 = tmp_path / "extra1", tmp_path / "extra2"
    extra1.mkdir()
    link = _link(model_file, extra2 / "Tiny-Model.Q4_1.gguf")
    monkeypatch.setenv("GGUF_PROVIDER_MODELS", os.pathsep.join([str(extra1), str(extra2)]))
    m = resolve_model("tiny-model")
    assert m.path == link and m.source == "models-dir"
    names = {lm.name: lm for lm in list_local_models(cache_dir=tmp_path / "no-hf-cache")}
    assert names["Tiny-Model.Q4_1"].path == link and names["Tiny-Model.Q4_1"].source == "models-dir"


def test_unknown_name(home: Path) -> None:
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("no-such-model")
    msg = str(err.value)
    assert str(home / "models") in msg and "org/repo" in msg


def test_spec_conflicts(home: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="conflicting"):
        resolve_model("org/repo:Q4_K_M", quant="Q8_0")
    with pytest.raises(ModelNotFoundError, match="not both"):
        resolve_model("org/repo", repo="org/other")
    with pytest.raises(ModelNotFoundError, match="no model given"):
        resolve_model()


# --- a ModelRef in one pass --------------------------------------------------------------------------------------


def test_a_model_ref_resolves_its_model_projector_and_draft(home: Path, tmp_path: Path, model_file: Path) -> None:
    model = _link(model_file, tmp_path / "v" / "model-Q4_1.gguf")
    proj = StandIn("elsewhere/mmproj-x-f16.gguf", 0, {"general.architecture": "clip"}).write(tmp_path)
    found = resolve(ModelRef(str(model), mmproj=str(proj), vision=True, draft=str(model_file)))
    assert (found.model.path, found.model.mmproj, found.model.source) == (model, proj, "path")
    assert found.draft is not None and found.draft.path == model_file
    assert resolve(ModelRef(str(model))).draft is None
    # model_path is used instead of model/repo/quant, as given
    assert resolve(ModelRef("org/repo", quant="Q8_0", model_path=str(model))).model.path == model


def test_an_explicit_projector_is_checked_before_the_model_is_looked_for(home: Path, model_file: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no multimodal projector"):
        resolve(ModelRef("no-such-model", mmproj=str(model_file)))


def test_a_draft_that_names_nothing_says_what_speculative_takes(home: Path, model_file: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"speculative='ngarm' names no draft model: no model named"):
        resolve(ModelRef(str(model_file), draft="ngarm"))


def test_pull_refuses_a_local_model_and_offline_mode(home: Path, model_file: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline, pull takes what is cached (tests/integration_tests/test_cli_and_hf_e2e.py) and says when a model
    is not: the Hub cannot be asked."""
    with pytest.raises(ModelNotFoundError, match=r"pull needs a Hugging Face repo .*is not one: a path or a models-dir name"):
        pull(str(model_file))
    with pytest.raises(ModelNotFoundError, match="not in the Hugging Face cache .* offline mode is on"):
        pull(ModelRef("org/repo", offline=True))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="HF_HUB_OFFLINE=1"):
        pull("org/repo")
    with pytest.raises(ModelNotFoundError, match="cannot pull again"):
        pull("org/repo", force=True)
