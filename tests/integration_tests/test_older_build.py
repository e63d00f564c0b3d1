"""gguf-provider on a llama-server two years older than its pin (llama-cpp-python 0.3.2's llama.cpp, 2024-11-16;
scripts/old_llama_server.py builds it): what the build lacks is left out in one line or refused by name, and the rest
works end to end — chat, streaming, embeddings, the prompt cache — over TCP with a key file, since that build binds
no Unix socket."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gguf_provider import ChatGGUF, GGUFEmbeddings
from gguf_provider.errors import BuildFeatureWarning
from scripts import old_llama_server

# Starts of SmolLM2 and MiniLM on the old build: ~1 s each, ~10 s under 2 hogs on 2 cores.
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def old(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    binary = old_llama_server.target()
    assert binary.is_file(), "run `make setup-test` (scripts/old_llama_server.py)"
    monkeypatch.setenv("GGUF_PROVIDER_LLAMA_SERVER", str(binary))
    from gguf_provider.runtime._serve import features

    features._said.clear()  # its one line, said again for this test
    yield binary


def test_chat_and_embeddings_on_a_build_of_2024(old: Path, smollm2_path: Path, minilm_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm = ChatGGUF(model=str(smollm2_path), max_tokens=8, keep_alive=0)
        first = llm.invoke("Say hi.")
        streamed = "".join(str(c.content) for c in llm.stream("Say hello."))
    assert isinstance(first.content, str) and first.content and streamed
    said = [str(w.message) for w in caught if issubclass(w.category, BuildFeatureWarning)]
    assert len(said) == 1 and "--jinja" in said[0] and "--kv-unified" in said[0] and "server install" in said[0]
    argv = psutil.Process(llm.engine.info.pid).cmdline()
    assert argv[0] == str(old) and "--jinja" not in argv and "--kv-unified" not in argv
    assert llm.engine.info.address.url is not None and "--api-key-file" in argv  # TCP on loopback, a key file
    assert "--slots" in argv  # /slots is off by default there: `ps` and the prompt cache read it
    llm.unload()
    emb = GGUFEmbeddings(model=str(minilm_path), keep_alive=0)
    assert len(emb.embed_query("hello")) == 384
    emb.unload()


def test_what_the_build_lacks_is_refused_by_name(old: Path, smollm2_path: Path) -> None:
    with pytest.raises(ValueError, match=r"reasoning_format='none' needs a llama-server with --reasoning-format; "
                                         r".* has none\. `gguf-provider server install`"):
        ChatGGUF(model=str(smollm2_path), reasoning_format="none", max_tokens=4).invoke("hi")
    with pytest.raises(ValueError, match=r"speculative='ngram-mod' needs a newer llama-server"):
        ChatGGUF(model=str(smollm2_path), speculative="ngram-mod", max_tokens=4).invoke("hi")
