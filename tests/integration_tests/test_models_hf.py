"""resolve_model() against a local Hugging Face-compatible endpoint serving real GGUF files.

The endpoint (tests/support/hf_endpoint.py) serves quant variants made with the real llama-quantize and a split set
made with the real llama-gguf-split from the SmolLM2 test model; huggingface_hub 2.4.0 talks to it unmodified. Each
test gets an empty Hugging Face cache of its own; the generated files are cached under <home>/test-fixtures/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gguf_provider.errors import (
    InsufficientDiskError,
    ModelDownloadError,
    ModelNotFoundError,
    UnknownQuantError,
)
from gguf_provider.runtime._models import hub as models_hub
from gguf_provider.runtime._models import list_local_models, pull, resolve_model
from tests.support.hf_endpoint import FixtureFiles, HFEndpoint, file_sha256
from tests.support.hf_repos import BROKEN, FLAKY, MAIN, ODD, PRIVATE, SPLIT, TOKEN, TRICKY


def _cache() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def test_default_quant_preference(hub: HFEndpoint, files: FixtureFiles) -> None:
    m = resolve_model(MAIN)
    assert m.source == "hf" and m.repo == MAIN and m.quant == "Q4_K_M"
    assert m.path.name == "SmolLM2-135M-Instruct-Q4_K_M.gguf"
    assert m.shards == (m.path,) and m.mmproj is None
    assert m.size_bytes == files.quants["Q4_K_M"].stat().st_size
    assert file_sha256(m.path) == file_sha256(files.quants["Q4_K_M"])
    assert str(m.path).startswith(str(_cache()))  # the standard cache, snapshot path


def test_default_falls_back_to_smallest(hub: HFEndpoint, files: FixtureFiles) -> None:
    m = resolve_model(ODD)  # no Q4_K_M/Q4_K_S/Q5_K_M/Q8_0 -> smallest file
    assert m.path.name == "odd-Q5_0.gguf" and m.quant == "Q5_0"


@pytest.mark.parametrize("spec, kw, expected", [
    (f"{MAIN}:Q8_0", {}, "SmolLM2-135M-Instruct-Q8_0.gguf"),
    (f"{MAIN}:iq4_xs", {}, "SmolLM2-135M-Instruct-IQ4_XS.gguf"),
    (None, {"repo": MAIN, "quant": "q8_0"}, "SmolLM2-135M-Instruct-Q8_0.gguf"),
    (MAIN, {"filename": "SmolLM2-135M-Instruct-IQ4_XS.gguf"}, "SmolLM2-135M-Instruct-IQ4_XS.gguf"),
])
def test_explicit_quant(hub: HFEndpoint, spec: str | None, kw: dict[str, str], expected: str) -> None:
    m = resolve_model(spec, **kw)  # type: ignore[arg-type]
    assert m.path.name == expected
    assert [r for r in hub.requests if r.method == "GET" and "/resolve/" in r.path][0].path.endswith(expected)


@pytest.mark.parametrize("quant, expected, source", [
    ("Q4_K_M", "tricky-Q4_K_M.gguf", "Q4_K_M"),
    ("IQ4_K_M", "tricky-IQ4_K_M.gguf", "IQ4_XS"),
    ("F16", "tricky-F16.gguf", None),
    ("bf16", "tricky-BF16.gguf", "Q8_0"),
])
def test_quant_whole_token_match(hub: HFEndpoint, files: FixtureFiles, quant: str, expected: str,
                                 source: str | None) -> None:
    m = resolve_model(TRICKY, quant=quant)
    assert m.path.name == expected
    want = files.quants[source] if source else files.source
    assert file_sha256(m.path) == file_sha256(want)


def test_unknown_quant_lists_available(hub: HFEndpoint) -> None:
    with pytest.raises(UnknownQuantError) as err:
        resolve_model(f"{MAIN}:Q3_K_S")
    assert set(err.value.available) == {"IQ4_XS", "Q4_K_M", "Q8_0"}  # no mmproj among them
    msg = str(err.value)
    assert "Q3_K_S" in msg and "Q4_K_M (105.5 MB)" in msg and "IQ4_XS (91.3 MB)" in msg
    assert not [r for r in hub.requests if "/resolve/" in r.path]  # nothing downloaded


def test_split_set_all_shards(hub: HFEndpoint, files: FixtureFiles) -> None:
    m = resolve_model(f"{SPLIT}:Q4_1")
    assert len(m.shards) == len(files.split) == 3
    assert m.path == m.shards[0] and m.path.name.endswith("-00001-of-00003.gguf")
    assert m.path.parent.name == "Q4_1"  # subfolder kept, shards side by side under their repo names
    assert [s.name for s in m.shards] == [p.name for p in files.split]
    for got, want in zip(m.shards, files.split, strict=True):
        assert file_sha256(got) == file_sha256(want)
    assert m.size_bytes == sum(p.stat().st_size for p in files.split)


def test_split_repo_default_prefers_q8_0(hub: HFEndpoint) -> None:
    assert resolve_model(SPLIT).path.name == "SmolLM2-135M-Instruct-Q8_0.gguf"


def test_vision_fetches_preferred_mmproj(hub: HFEndpoint, files: FixtureFiles) -> None:
    m = resolve_model(MAIN, vision=True)
    assert m.path.name == "SmolLM2-135M-Instruct-Q4_K_M.gguf"
    assert m.mmproj is not None and m.mmproj.name == "mmproj-model-f16.gguf"
    assert file_sha256(m.mmproj) == file_sha256(files.source)


def test_vision_without_mmproj_errors(hub: HFEndpoint) -> None:
    with pytest.raises(ModelNotFoundError, match="mmproj"):
        resolve_model(ODD, vision=True)


def test_offline_from_cache_after_download(hub: HFEndpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    online = resolve_model(f"{SPLIT}:Q4_1")
    before = len(hub.requests)
    offline = resolve_model(f"{SPLIT}:Q4_1", offline=True)
    assert offline == online
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model(f"{SPLIT}:Q4_1") == online
    assert len(hub.requests) == before  # no network at all
    listed = {(lm.name, lm.n_shards) for lm in list_local_models() if lm.source == "hf"}
    assert (f"{SPLIT}:Q4_1", 3) in listed


def test_offline_not_cached_errors(hub: HFEndpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelNotFoundError, match="offline") as err:
        resolve_model(MAIN, offline=True)
    assert "pull" in str(err.value)
    resolve_model(f"{MAIN}:Q8_0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UnknownQuantError, match="IQ4_XS"):
        resolve_model(f"{MAIN}:IQ4_XS")  # the repo is cached, that quant is not
    assert resolve_model(MAIN).quant == "Q8_0"  # offline default: the best of what is cached


def test_disk_preflight(hub: HFEndpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models_hub, "_free_disk_bytes", lambda path: 50_000_000)
    with pytest.raises(InsufficientDiskError) as err:
        resolve_model(f"{SPLIT}:Q4_1")
    msg = str(err.value)
    assert "98.4 MB" in msg and "50.0 MB" in msg
    assert not [r for r in hub.requests if r.method == "GET" and "/resolve/" in r.path]
    # Files already complete in the cache do not count: after a download, zero free bytes are enough.
    monkeypatch.setattr(models_hub, "_free_disk_bytes", lambda path: 10**12)
    first = resolve_model(f"{SPLIT}:Q4_1")
    monkeypatch.setattr(models_hub, "_free_disk_bytes", lambda path: 0)
    assert resolve_model(f"{SPLIT}:Q4_1") == first


def test_progress_callback(hub: HFEndpoint, files: FixtureFiles) -> None:
    calls: list[tuple[int, int, str]] = []
    stages: set[str] = set()

    def progress(stage: str, done: int, total: int, detail: str = "") -> None:
        stages.add(stage)
        calls.append((done, total, detail))

    m = resolve_model(f"{SPLIT}:Q4_1", progress=progress)
    assert stages == {"download"}
    total = m.size_bytes
    assert calls and all(t == total for _, t, _ in calls)
    assert calls[-1][0] == total
    assert [d for d, _, _ in calls] == sorted(d for d, _, _ in calls)
    assert {f for _, _, f in calls} == {f"Q4_1/{p.name}" for p in files.split}


def test_interrupted_download_is_resumed(hub: HFEndpoint, files: FixtureFiles) -> None:
    hub.drop_once.add((FLAKY, "flaky-Q4_K_M.gguf"))
    m = resolve_model(FLAKY)
    gets = hub.downloads_of(FLAKY, "flaky-Q4_K_M.gguf")
    assert len(gets) == 2 and "range" not in gets[0].headers
    assert gets[1].headers["range"].startswith("bytes=") and gets[1].headers["range"] != "bytes=0-"
    assert file_sha256(m.path) == file_sha256(files.quants["Q4_K_M"])


def test_incomplete_download_never_taken_for_a_model(hub: HFEndpoint) -> None:
    hub.truncate_always.add((BROKEN, "broken-Q4_K_M.gguf"))
    try:
        with pytest.raises(ModelDownloadError):
            resolve_model(BROKEN)
    finally:
        hub.truncate_always.discard((BROKEN, "broken-Q4_K_M.gguf"))
    storage = _cache() / "models--test-org--broken-GGUF"
    assert not list(storage.rglob("*.gguf"))
    assert not [p for p in (storage / "blobs").iterdir()] if (storage / "blobs").exists() else True
    with pytest.raises(ModelNotFoundError):
        resolve_model(BROKEN, offline=True)


def test_missing_repo_and_token(hub: HFEndpoint) -> None:
    with pytest.raises(ModelNotFoundError, match="not found") as err:
        resolve_model("test-org/does-not-exist")
    assert "token" in str(err.value)
    with pytest.raises(ModelNotFoundError, match="token"):
        resolve_model(PRIVATE)
    assert resolve_model(PRIVATE, hf_token=TOKEN).path.name == "private-Q4_K_M.gguf"


def test_unreachable_hub_falls_back_to_cache(hub: HFEndpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    first = resolve_model(f"{MAIN}:IQ4_XS")
    dead = "http://127.0.0.1:9"  # discard port: connection refused
    monkeypatch.setattr(constants, "ENDPOINT", dead)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", dead + "/{repo_id}/resolve/{revision}/{filename}")
    assert resolve_model(f"{MAIN}:IQ4_XS") == first
    with pytest.raises(ModelNotFoundError, match="could not be reached"):
        resolve_model(f"{MAIN}:Q8_0")
    cached = pull(f"{MAIN}:IQ4_XS")  # what is cached is a no-op, saying why the Hub was not asked
    assert cached == first and cached.cached and "could not be reached" in cached.cached
    with pytest.raises(ModelNotFoundError, match="could not reach"):
        pull(f"{MAIN}:IQ4_XS", force=True)  # again, though: only from the Hub


def test_pull_downloads_and_rejects_local(hub: HFEndpoint, files: FixtureFiles) -> None:
    m = pull(f"{MAIN}:Q8_0")
    assert file_sha256(m.path) == file_sha256(files.quants["Q8_0"])
    with pytest.raises(ModelNotFoundError, match="pull needs"):
        pull(str(files.source))


def test_revision_pins_a_commit(hub: HFEndpoint) -> None:
    """``revision=`` resolves that commit (into its own snapshot dir); an unknown revision is a typed error."""
    commit = hub.repos[MAIN].commit
    m = resolve_model(MAIN, quant="Q8_0", revision=commit)
    assert m.path.name == "SmolLM2-135M-Instruct-Q8_0.gguf"
    assert m.path.parent.name == commit  # snapshots/<commit>/
    assert any(f"/resolve/{commit}/" in r.path for r in hub.requests if r.method == "GET")
    with pytest.raises(ModelNotFoundError, match="no-such-rev"):
        resolve_model(MAIN, quant="Q8_0", revision="no-such-rev")


def test_engine_progress_reports_download_then_loading(hub: HFEndpoint) -> None:
    """An Engine's progress callback sees download bytes first, then "loading" while /health is 503."""
    from gguf_provider.engine import Engine, EngineConfig

    seen: list[tuple[str, int, int]] = []
    engine = Engine(EngineConfig(repo=MAIN, quant="Q8_0", n_ctx=512, shared=False,
                                 progress=lambda stage, done, total, detail="": seen.append((stage, done, total))))
    try:
        engine.load()
    finally:
        engine.unload()
    stages = [s for s, _, _ in seen]
    assert stages and stages[0] == "download" and "loading" in stages
    assert stages.index("loading") > max(i for i, s in enumerate(stages) if s == "download")
    downloads = [(d, t) for s, d, t in seen if s == "download"]
    assert downloads[-1][0] == downloads[-1][1] > 0  # the last report is the whole file
