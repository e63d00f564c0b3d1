"""Issue 14 with real servers: speculative decoding on by default (the build's n-gram self-speculation), off, an n-gram
type, a draft model (Qwen2.5-Coder-0.5B drafting for itself), a mismatched draft refused before anything starts, a
build without speculation, vision and embedding servers, drafted/accepted tokens in both adapters' metadata, the
magics and `serve`; and `kv_cache_type="q8_0"` fitting a larger automatic context than f16 under one memory limit.

What the server runs is read from its own command line and `/slots` (each slot says whether it speculates)."""

from __future__ import annotations

import base64
import io
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from langchain_core.messages import AIMessage
from llama_index.core.base.llms.types import ChatMessage

from gguf_provider import ChatGGUF
from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.errors import DraftModelMismatchError, MemoryBudgetWarning, SpeculationWarning
from gguf_provider.llama_index import GGUF
from gguf_provider.runtime._common import gguf
from gguf_provider.runtime._serve import budget, speculative
from tests.support.runtime import ROOT, RuntimeEnv, reap, wait_until
from tests.support.timing import REACT

# A hang guard: the slowest test takes ~42 s under load, 10x; but the one marked below.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

N_CTX = 4096
# Code the model is asked to copy: its reply repeats the prompt, so n-gram drafts get accepted.
CODE = "\n".join(f"def handler_{i}(request):\n    return respond(request, status={200 + i}, body='ok')\n"
                 for i in range(8))
PROMPT = f"Copy this Python code exactly, with no other text:\n\n{CODE}"
MAX_TOKENS = 96


def _argv(engine: Engine) -> list[str]:
    return psutil.Process(engine.info.pid).cmdline()


def _slots_speculate(engine: Engine) -> bool:
    addr = engine.info.address
    with httpx.Client(transport=addr.transport(), base_url=addr.base_url, headers=addr.headers(), timeout=10) as h:  # a GET: ~ms
        slots = h.get("/slots").json()
    return all(s["speculative"] for s in slots)


def _qwen(path: Path, **kw: Any) -> ChatGGUF:
    return ChatGGUF(model_path=str(path), n_ctx=N_CTX, temperature=0, max_tokens=MAX_TOKENS, **kw)


@pytest.mark.timeout(1300)  # two starts, three replies of a 400-token prompt: ~128 s under load; 10x
def test_auto_speculates_and_both_adapters_report_drafted_tokens(rt: RuntimeEnv, qwen_path: Path) -> None:
    auto = _qwen(qwen_path)  # the default
    off = _qwen(qwen_path, speculative=False)
    try:
        reply = auto.invoke(PROMPT)
        assert isinstance(reply, AIMessage)
        argv = _argv(auto.engine)
        assert "--spec-default" in argv and _slots_speculate(auto.engine)
        timings = reply.response_metadata["timings"]
        assert timings["draft_n"] > 0 and 0 < timings["draft_n_accepted"] <= timings["draft_n"]
        # LlamaIndex on the same server (same spec: shared), streamed: the last response's raw has them too.
        li = GGUF(model_path=str(qwen_path), n_ctx=N_CTX, temperature=0, max_tokens=MAX_TOKENS)
        last = list(li.stream_chat([ChatMessage(role="user", content=PROMPT)]))[-1]
        assert li.engine.info.pid == auto.engine.info.pid
        assert last.raw["timings"]["draft_n_accepted"] > 0
        li.engine.unload()
        # Off: another server, no speculation flags, no drafts. (Its greedy text is not compared with the
        # speculating server's: checking drafts in a batch rounds differently from one token at a time, so a
        # near-tie can go the other way on another CPU.)
        plain = off.invoke(PROMPT)
        assert off.engine.info.pid != auto.engine.info.pid
        assert not [a for a in _argv(off.engine) if a.startswith("--spec")] and not _slots_speculate(off.engine)
        assert "draft_n" not in plain.response_metadata["timings"]
        assert str(plain.content).strip()
    finally:
        auto.engine.unload()
        off.engine.unload()


def test_an_explicit_ngram_type(rt: RuntimeEnv, qwen_path: Path) -> None:
    llm = _qwen(qwen_path, speculative="ngram-simple")
    try:
        argv = _argv(llm.engine)
        assert argv[argv.index("--spec-type") + 1] == "ngram-simple" and _slots_speculate(llm.engine)
        with pytest.raises(ValueError, match=r"did you mean 'ngram-mod'"):  # the build's list decides, at start
            _qwen(qwen_path, speculative="ngram-mdo").engine.load()
        assert len(rt.servers()) == 1
    finally:
        llm.engine.unload()


def test_a_draft_model_drafts_for_itself(rt: RuntimeEnv, qwen_path: Path) -> None:
    llm = _qwen(qwen_path, speculative=str(qwen_path))
    try:
        reply = llm.invoke(PROMPT)
        argv = _argv(llm.engine)
        assert argv[argv.index("--spec-draft-model") + 1] == str(qwen_path)
        assert argv[argv.index("--spec-type") + 1] == "draft-simple" and _slots_speculate(llm.engine)
        assert reply.response_metadata["timings"]["draft_n_accepted"] > 0
        # The budget charged both models (two files, two KV caches) and the prompt cache it gave the server.
        header, size = gguf.read_header(qwen_path), qwen_path.stat().st_size
        entry = rt.registry()[llm.engine.info.key]
        n_ctx = entry["n_ctx"]
        assert entry["charge"] == (budget.charge(header, 2 * size, n_ctx, draft=header)
                                   + budget.prompt_ram(header, n_ctx, pool=budget.ram_pool()))
    finally:
        llm.engine.unload()


def test_a_mismatched_draft_is_refused_before_any_server_starts(
        rt: RuntimeEnv, qwen_path: Path, smollm2_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(DraftModelMismatchError) as info:
        _qwen(qwen_path, speculative=str(smollm2_path)).load()
    assert time.monotonic() - t0 < 10  # refused from the headers, before any start: ~0.07 s under load
    message = str(info.value)
    assert smollm2_path.name in message and qwen_path.name in message and "49152 tokens vs 151936" in message
    assert rt.servers() == [] and rt.registry() == {}


def test_a_build_without_speculation_runs_without_it_and_says_so_once(rt: RuntimeEnv, tmp_path: Path) -> None:
    """The real binary behind a wrapper whose --help lists no --spec flag (an older build, as far as we can tell)."""
    wrapper = tmp_path / "old-build" / "llama-server"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nif [ "$1" = "--help" ]; then "{rt.binary}" --help 2>&1 | grep -v -e "--spec"; '
                       f'exit 0; fi\nexec "{rt.binary}" "$@"\n')
    wrapper.chmod(0o755)
    speculative._warned.clear()
    first = Engine(EngineConfig(model_path=str(rt.model), n_ctx=1024, llama_server=str(wrapper)))
    second = Engine(EngineConfig(model_path=str(rt.model), n_ctx=1024, llama_server=str(wrapper), shared=False))
    try:
        with pytest.warns(SpeculationWarning, match=r"runs without speculative decoding \(it has neither "
                                                    r"--spec-default nor --spec-type ngram-mod"):
            first.load()
        assert not [a for a in _argv(first) if a.startswith("--spec")]
        assert first.chat({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).content
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            second.load()  # another server from the same build: not said again
        assert second.info.pid != first.info.pid
        assert not [w for w in seen if issubclass(w.category, SpeculationWarning)]
    finally:
        first.unload()
        second.unload()


def test_vision_servers_speculate_and_read_images(rt: RuntimeEnv, projector_path: Path) -> None:
    """This build takes --spec-default beside a projector; the image still counts in the prompt."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buf, "PNG")
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(buf.getvalue())
                                                .decode()}}
    engine = Engine(EngineConfig(model_path=str(rt.model), mmproj=str(projector_path), n_ctx=2048))
    try:
        assert "--spec-default" in _argv(engine) and "--mmproj" in _argv(engine) and _slots_speculate(engine)
        text = [{"type": "text", "text": "Describe it."}]
        with_image = engine.chat({"messages": [{"role": "user", "content": [*text, image]}], "max_tokens": 1})
        alone = engine.chat({"messages": [{"role": "user", "content": text}], "max_tokens": 1})
        assert with_image.usage and alone.usage and with_image.usage.prompt_tokens > alone.usage.prompt_tokens
    finally:
        engine.unload()


def test_embedding_servers_get_no_speculation(rt: RuntimeEnv, minilm_path: Path) -> None:
    engine = Engine(EngineConfig(model_path=str(minilm_path), embedding=True))  # speculative left at "auto"
    try:
        assert not [a for a in _argv(engine) if a.startswith("--spec")]
        assert len(engine.embed(["a cat"])[0]) == 384
    finally:
        engine.unload()


def test_q8_0_cache_fits_a_larger_automatic_context_under_a_memory_limit(
        rt: RuntimeEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    header = gguf.read_header(rt.model)  # SmolLM2: native 8192
    size = rt.model.stat().st_size
    limit = budget.charge(header, size, 4096)
    monkeypatch.setenv(budget.LIMIT_ENV, str(limit))

    def charged(n_ctx: int, cache_type: str) -> int:  # the server and its host-RAM prompt cache (--cache-ram)
        return (budget.charge(header, size, n_ctx, cache_type=cache_type)
                + budget.prompt_ram(header, n_ctx, cache_type=cache_type, pool=limit))

    def expected(cache_type: str) -> int:
        return max(c for c in range(2048, 8193, 256) if charged(c, cache_type) <= limit)

    contexts = {}
    for cache_type in ("f16", "q8_0"):
        engine = Engine(EngineConfig(model_path=str(rt.model), kv_cache_type=cache_type, speculative=False))
        try:
            with pytest.warns(MemoryBudgetWarning, match="shrunk from 8192"):
                contexts[cache_type] = engine.load().n_ctx
            argv = _argv(engine)
            if cache_type == "q8_0":
                assert argv[argv.index("--cache-type-k") + 1] == "q8_0" == argv[argv.index("--cache-type-v") + 1]
                assert argv[argv.index("--flash-attn") + 1] == "on"
            else:
                assert "--cache-type-k" not in argv
            entry = rt.registry()[engine.info.key]
            assert entry["charge"] == charged(entry["n_ctx"], cache_type)
            reply = engine.chat({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
                                 "temperature": 0})
            assert reply.content.strip()
        finally:
            engine.unload()
        # its charge is gone before the next one is admitted (unload stopped it: ~0.01 s under load)
        wait_until(lambda: not rt.servers(), REACT)
    assert contexts == {"f16": expected("f16"), "q8_0": expected("q8_0")}
    # 2 bytes vs 34/32 per element (1.88x), less the compute buffers that grow with the context too
    assert contexts["q8_0"] >= 1.4 * contexts["f16"]


def test_magics_load_takes_speculative(rt: RuntimeEnv, qwen_path: Path) -> None:
    from IPython.core.error import UsageError
    from IPython.testing import globalipapp

    shell = globalipapp.start_ipython() or globalipapp.get_ipython()  # None: started by an earlier test
    shell.run_line_magic("load_ext", "gguf_provider")
    magics = shell.magics_manager.registry["GGUFMagics"]
    try:
        shell.run_line_magic("gguf", f"load {rt.model} --ctx 1024 --as nospec --speculative off")
        assert not [a for a in _argv(magics.models["nospec"].engine) if a.startswith("--spec")]
        shell.run_line_magic("gguf", f"load {rt.model} --ctx 1024 --as spec")  # the default: auto
        assert "--spec-default" in _argv(magics.models["spec"].engine)
        with pytest.raises(UsageError, match=r"%gguf load: .*did you mean 'ngram-mod'"):
            shell.run_line_magic("gguf", f"load {rt.model} --ctx 1024 --as bad --speculative ngram-mdo")
        with pytest.raises(UsageError, match="DraftModelMismatch|cannot draft for"):
            shell.run_line_magic("gguf", f"load {qwen_path} --ctx 1024 --as mix --speculative {rt.model}")
        with pytest.raises(UsageError, match=r"`--kv-cache-type q9` is not a KV cache type"):
            shell.run_line_magic("gguf", f"load {rt.model} --as q --kv-cache-type q9")
    finally:
        shell.run_line_magic("gguf", "unload --all")


def test_serve_takes_speculative_and_kv_cache_type(rt: RuntimeEnv) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "gguf_provider.cli", "serve", str(rt.model), "--ctx", "1024",
                             "--speculative", "ngram-simple", "--kv-cache-type", "q8_0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "speculative ngram-simple, KV cache q8_0" in line, (line, proc.stderr.read() if proc.poll() else "")
        (server,) = rt.servers()
        argv = server.cmdline()
        assert argv[argv.index("--spec-type") + 1] == "ngram-simple" and argv[argv.index("--cache-type-k") + 1] == "q8_0"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)  # serve stops its server and exits: ~0.2 s under load
        reap(proc)
    wait_until(lambda: not rt.servers(), REACT)  # ~0.01 s under load
    bad = rt.gguf_cli("serve", str(rt.model), "--kv-cache-type", "q9_0")
    assert bad.returncode == 2 and "did you mean 'q8_0'" in bad.stderr
