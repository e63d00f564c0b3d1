"""Ollama identities, offline: each model file's digest (marker, Hugging Face blob, the digest cache, a hash in the
background, and the provisional digest while one runs), its header details, and what /api/tags, /api/show answer
over GGUF files the tests write. (The real ollama client against a real gateway and the real models:
tests/integration_tests/test_gateway_ollama_identity.py.)"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gguf_provider.gateway import Settings, create_app
from gguf_provider.runtime import default as runtime
from gguf_provider.runtime._models import identity
from gguf_provider.runtime._models.identity import Digests
from tests.support.gguf_bytes import TEMPLATE
from tests.support.gguf_tables import F32, QWEN_FILE, QWEN_META, qwen_tensors, write_gguf

TOOLS_TEMPLATE = ("{%- if tools %}{{ '<tools>' }}{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}"
                  + TEMPLATE)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of its own (the digest cache is under it) and a fresh process table of digests."""
    h = tmp_path / "home"
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(h))
    monkeypatch.setattr(identity, "_digests", Digests())
    return h


def small(path: Path, arch: str = "llama", n: int = 64, **meta: str | int) -> Path:
    """A small GGUF file: ``arch``'s header keys, one F32 tensor of ``n`` x 3 elements, and its data."""
    return write_gguf(path, {"general.architecture": arch, "general.file_type": 0, f"{arch}.context_length": 512,
                             f"{arch}.embedding_length": 64, **meta}, [("token_embd.weight", (n, 3), F32)])


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_parameter_size_as_ollama_writes_it() -> None:
    assert identity.parameter_size(494_032_768) == "494.03M"
    assert identity.parameter_size(1_543_714_304) == "1.5B"
    assert identity.parameter_size(7_000_000_000) == "7B"
    assert identity.parameter_size(134_515_008) == "134.52M"
    assert identity.parameter_size(135_000_000) == "135M"
    assert identity.parameter_size(22_700) == "23K"
    assert identity.parameter_size(999) == "999"


def test_a_hashed_file_gets_its_sha256_and_the_next_process_reads_it_from_the_cache(home: Path,
                                                                                       tmp_path: Path) -> None:
    f = small(tmp_path / "m" / "a.Q8_0.gguf")
    d = Digests()
    assert d.digest(f, wait=30) == f"sha256:{sha(f)}"
    assert list((home / "digests").iterdir())  # written for the next process

    def never(path: Path) -> str:
        raise AssertionError("a cached digest is not hashed again")

    assert Digests(hasher=never).digest(f) == f"sha256:{sha(f)}"
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 10**9))  # the file changed: the cache entry is not its
    assert Digests().digest(f, wait=30) == f"sha256:{sha(f)}"


def test_a_marker_beside_the_file_is_taken_only_while_it_describes_the_file(home: Path, tmp_path: Path) -> None:
    f = small(tmp_path / "m" / "b.gguf")
    st = f.stat()
    fake = "ab" * 32  # not the content's: shows that the marker is what answered
    f.with_name(f.name + ".sha256").write_text(f"{fake} {st.st_size} {st.st_mtime_ns}\n")
    assert Digests().digest(f) == f"sha256:{fake}"
    f.with_name(f.name + ".sha256").write_text(f"{fake} {st.st_size + 1} {st.st_mtime_ns}\n")  # stale
    assert Digests().digest(f, wait=30) == f"sha256:{sha(f)}"


def test_a_hugging_face_snapshot_file_is_its_blobs_name(home: Path, tmp_path: Path) -> None:
    blob_sha = "cd" * 32
    blob = small(tmp_path / "hub" / "models--o--r" / "blobs" / blob_sha)
    snap = tmp_path / "hub" / "models--o--r" / "snapshots" / "c0ffee" / "r.Q8_0.gguf"
    snap.parent.mkdir(parents=True)
    snap.symlink_to(os.path.relpath(blob, snap.parent))

    def never(path: Path) -> str:
        raise AssertionError("a blob is not hashed")

    assert Digests(hasher=never).digest(snap) == f"sha256:{blob_sha}"


def test_while_a_hash_runs_a_file_answers_one_provisional_digest_for_the_whole_process(home: Path,
                                                                                     tmp_path: Path) -> None:
    a = small(tmp_path / "m" / "a.gguf")
    b = small(tmp_path / "m" / "b.gguf")  # the same bytes as a: another file all the same until hashed
    (tmp_path / "m" / "link.gguf").symlink_to(a)
    os.link(a, tmp_path / "m" / "hard.gguf")
    go = threading.Event()

    def slow(path: Path) -> str:
        go.wait(30)
        return identity.hash_file(path)

    d = Digests(hasher=slow)
    first = d.many([a, b, tmp_path / "m" / "link.gguf", tmp_path / "m" / "hard.gguf", tmp_path / "none.gguf"],
                   wait=0.2)
    assert first[0] is not None and first[1] is not None and first[4] is None
    assert first[0] != first[1]  # two files, two digests
    assert first[2] == first[3] == first[0]  # every name of a file has the file's
    assert first[0] != f"sha256:{sha(a)}" and first[0].startswith("sha256:") and len(first[0]) == 71
    go.set()
    deadline = time.monotonic() + 30
    while not list((home / "digests").glob("*")) or len(list((home / "digests").glob("*"))) < 2:
        assert time.monotonic() < deadline, "the background hash did not finish"
        time.sleep(0.05)
    assert d.digest(a) == first[0] and d.digest(b) == first[1]  # kept for the process, hash done or not
    assert Digests().digest(a) == Digests().digest(b) == f"sha256:{sha(a)}"  # the next process: the content's


def test_a_hash_in_time_is_the_answer(home: Path, tmp_path: Path) -> None:
    a = small(tmp_path / "m" / "a.gguf")

    def slowish(path: Path) -> str:
        time.sleep(0.2)
        return identity.hash_file(path)

    assert Digests(hasher=slowish).digest(a, wait=30) == f"sha256:{sha(a)}"


def test_identify_reads_the_header_a_real_table_counted(home: Path, tmp_path: Path) -> None:
    f = write_gguf(tmp_path / "m" / QWEN_FILE, {**QWEN_META, "tokenizer.chat_template": TOOLS_TEMPLATE},
                   qwen_tensors(), data=False)  # the table only: what is counted
    [got] = runtime().identify([f], wait=30)
    assert got is not None
    count = sum(math.prod(shape) for _, shape, _ in qwen_tensors())
    assert got["parameter_count"] == count == got["metadata"]["general.parameter_count"]
    assert got["parameter_size"] == identity.parameter_size(count) and got["parameter_size"].endswith("M")
    assert got["architecture"] == "qwen2" and got["quant"] == "Q4_K_M" and got["context_length"] == 32768
    assert got["metadata"]["general.architecture"] == "qwen2" and got["metadata"]["qwen2.block_count"] == 24
    assert "tokenizer.chat_template" not in got["metadata"] and got["chat_template"] == TOOLS_TEMPLATE
    assert got["digest"] == f"sha256:{sha(f)}" and got["projector"] is None
    assert runtime().identify([tmp_path / "none.gguf", tmp_path], wait=1) == [None, None]  # none, a folder


def test_a_projector_counts_only_when_it_fits_the_model(home: Path, tmp_path: Path) -> None:
    m = small(tmp_path / "m" / "chat.gguf")
    proj = small(tmp_path / "m" / "mmproj-chat-f16.gguf", arch="clip", **{"clip.vision.projection_dim": 64})
    [got] = runtime().identify([m], digest=False)
    assert got is not None and got["projector"] == str(proj) and got["digest"] == ""
    small(proj, arch="clip", **{"clip.vision.projection_dim": 2048})  # made for another model's width
    os.utime(m, ns=(time.time_ns(), time.time_ns() + 10**9))  # the header facts are kept per file as it was
    [got] = runtime().identify([m], digest=False)
    assert got is not None and got["projector"] is None


# --- the Ollama endpoints ---------------------------------------------------------------------------------------


@pytest.fixture
def models(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    d = tmp_path / "models"
    small(d / "Chat-1B.Q8_0.gguf", n=1000, **{"tokenizer.chat_template": TOOLS_TEMPLATE})
    small(d / "Other-1B.Q8_0.gguf", n=2000, **{"tokenizer.chat_template": TEMPLATE})
    (d / "Chat-1B-alias.Q8_0.gguf").symlink_to(d / "Chat-1B.Q8_0.gguf")  # a second name of one file
    small(d / "Embed.F32.gguf", arch="bert", **{"bert.pooling_type": 1})
    monkeypatch.setenv("GGUF_PROVIDER_MODELS", str(d))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hub"))
    yield d


async def _get(method: str, path: str, **kw: object) -> httpx.Response:
    app = create_app(Settings())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:11480") as c:
        return await c.request(method, path, **kw)  # type: ignore[arg-type]


async def test_tags_give_one_digest_per_file_and_the_header_details(models: Path) -> None:
    r = await _get("GET", "/api/tags")
    assert r.status_code == 200, r.text
    by_name = {m["name"]: m for m in r.json()["models"]}
    chat, alias, other = by_name["Chat-1B.Q8_0"], by_name["Chat-1B-alias.Q8_0"], by_name["Other-1B.Q8_0"]
    assert chat["digest"] == alias["digest"] == f"sha256:{sha(models / 'Chat-1B.Q8_0.gguf')}"
    assert other["digest"] == f"sha256:{sha(models / 'Other-1B.Q8_0.gguf')}" != chat["digest"]
    assert chat["details"] == {"parent_model": "", "format": "gguf", "family": "llama", "families": ["llama"],
                               "parameter_size": "3K", "quantization_level": "F32"}  # the header's type
    assert other["details"]["parameter_size"] == "6K" and by_name["Embed.F32"]["details"]["family"] == "bert"


async def test_tags_never_hold_the_event_loop_while_a_file_is_hashed(models: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from gguf_provider.gateway import state

    release = threading.Event()

    def stuck(path: Path) -> str:
        release.wait(30)
        return identity.hash_file(path)

    monkeypatch.setattr(identity, "_digests", Digests(hasher=stuck))
    monkeypatch.setattr(state, "DIGEST_WAIT", 0.5)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    try:
        started = time.monotonic()
        first = (await _get("GET", "/api/tags")).json()["models"]
        took = time.monotonic() - started
    finally:
        ticker.cancel()
    assert 0.5 <= took < 10 and ticks >= 20  # waited its bound, and the loop ran meanwhile
    release.set()
    by_name = {m["name"]: m["digest"] for m in first}
    assert by_name["Chat-1B.Q8_0"] == by_name["Chat-1B-alias.Q8_0"] != by_name["Other-1B.Q8_0"]
    await asyncio.sleep(0.5)
    again = {m["name"]: m["digest"] for m in (await _get("GET", "/api/tags")).json()["models"]}
    assert again == by_name  # one digest per file for the whole process


async def test_show_details_model_info_and_capabilities(models: Path) -> None:
    chat = (await _get("POST", "/api/show", json={"model": "Chat-1B.Q8_0"})).json()
    assert chat["capabilities"] == ["completion", "tools"]
    assert chat["details"]["family"] == "llama" and chat["details"]["parameter_size"] == "3K"
    assert chat["model_info"]["general.architecture"] == "llama"
    assert chat["model_info"]["general.parameter_count"] == 3000
    assert chat["model_info"]["llama.context_length"] == 512
    other = (await _get("POST", "/api/show", json={"model": "Other-1B.Q8_0"})).json()
    assert other["capabilities"] == ["completion"]
    embed = (await _get("POST", "/api/show", json={"model": "Embed.F32"})).json()
    assert embed["capabilities"] == ["embedding"] and embed["details"]["family"] == "bert"


async def test_ps_with_nothing_loaded_is_empty(models: Path) -> None:
    r = await _get("GET", "/api/ps")
    assert r.status_code == 200 and r.json() == {"models": []}
