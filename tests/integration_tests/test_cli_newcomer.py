"""The command line as a newcomer meets it, with real servers and the local Hugging Face endpoint: options anywhere
among `embed` and `rerank`'s texts, `stop` that says what runs, `pull` of a cached model while the Hub cannot be
reached, advice in the CLI's flags, the model's name in `/v1/models`, and no ResourceWarning (every command runs
under ``-X dev -W always``, which prints them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gguf_provider.runtime._serve import registry
from tests.support.hf_endpoint import HFEndpoint
from tests.support.hf_repos import MAIN
from tests.support.runtime import reap, serving_line

CLI = [sys.executable, "-X", "dev", "-W", "always", "-m", "gguf_provider.cli"]
# Each command starts (or reuses) a small server: ~2 s, ~15 s under 2 hogs on 2 cores; the Hub fixture ~25 s.
pytestmark = pytest.mark.timeout(600)
LEAKS = ("ResourceWarning", "still running", "unclosed", "Traceback")


def run(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, input=stdin, timeout=300)
    assert not [w for w in LEAKS if w in out.stderr], out.stderr
    return out


def _ids() -> set[str]:
    return {r["id"] for r in json.loads(run("ps", "--json").stdout)["servers"]}


def test_embed_and_rerank_take_options_anywhere(minilm_path: Path, reranker_path: Path) -> None:
    out = run("embed", str(minilm_path), "--json", "hello world", "--keep-alive", "0", "good night")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [d["text"] for d in data["data"]] == ["hello world", "good night"] and data["dimensions"] == 384
    ranked = run("rerank", str(reranker_path), "how do pandas eat?", "--top-n", "1", "Pandas eat bamboo.",
                 "Cats purr.", "--keep-alive", "0")
    assert ranked.returncode == 0, ranked.stderr
    assert len(ranked.stdout.splitlines()) == 1  # --top-n 1, given between the documents
    assert not {minilm_path.stem, reranker_path.stem} & {r["model"] for r in
                                                         json.loads(run("ps", "--json").stdout)["servers"]}


def test_embed_advice_names_the_flag_and_a_chat_model_gets_a_hint(minilm_path: Path, smollm2_path: Path) -> None:
    long = "word " * 2000  # past MiniLM's 512 tokens
    out = run("embed", str(minilm_path), long, "--keep-alive", "0")
    assert out.returncode == 1 and "`--truncate`" in out.stderr and "truncate=True" not in out.stderr, out.stderr
    assert run("embed", str(minilm_path), long, "--truncate", "--keep-alive", "0").returncode == 0
    chat = run("embed", str(smollm2_path), "hello", "--keep-alive", "0")
    assert chat.returncode == 0 and "is a chat model" in chat.stderr and "docs/embeddings.md" in chat.stderr
    quiet = run("embed", str(minilm_path), "hello", "--keep-alive", "0")
    assert "chat model" not in quiet.stderr


def test_serve_names_the_model_and_stop_says_what_runs(smollm2_path: Path) -> None:
    """`serve --ctx 100` says the context it got; `/v1/models` answers with the model's name; `stop` alone lists
    the servers and asks which; a wrong name lists them too; the model's name stops it."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    serve = subprocess.Popen([*CLI, "serve", str(smollm2_path), "--port", "0", "--ctx", "100"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert serve.stdout is not None
        line = serving_line(serve.stdout)
        assert line.startswith("serving") and "(ctx 256," in line, line
        note, key_line = serve.stdout.readline(), serve.stdout.readline()
        assert note.startswith("gguf-provider: note: --ctx 100 became 256"), note
        entry = next(e for e in registry.read().values() if e.model == str(smollm2_path) and e.url)
        assert entry.api_key_file and entry.api_key_file in key_line
        key = Path(entry.api_key_file).read_text().strip()
        models = httpx.get(f"{entry.url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=5).json()
        assert [m["id"] for m in models["data"]] == [smollm2_path.stem]

        alone = run("stop")
        assert alone.returncode == 2 and "name the server to stop" in alone.stderr and "--all" in alone.stderr
        assert smollm2_path.name in alone.stderr
        ids = _ids()
        assert all(i in alone.stderr for i in ids)  # every id `ps` shows
        wrong = run("stop", smollm2_path.stem[:-3] + "xyz")
        assert wrong.returncode == 1 and "did you mean" in wrong.stderr and smollm2_path.name in wrong.stderr
        assert _ids() == ids  # nothing was stopped
        by_name = run("stop", smollm2_path.stem)
        assert by_name.returncode == 0 and f"stopped pid {entry.pid}" in by_name.stdout, by_name.stdout
        serve.wait(timeout=60)
        assert serve.returncode == 0
        rest = serve.stdout.read()
        assert not [w for w in LEAKS if w in rest], rest
    finally:
        reap(serve)


def _env(hub: HFEndpoint, **extra: str) -> dict[str, str]:
    keys = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_DISABLE_XET", "GGUF_PROVIDER_HOME")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_TOKEN")}
    env.update({k: os.environ[k] for k in keys if k in os.environ})
    return {**env, **extra}


def test_pull_of_a_cached_model_needs_no_hub(hub: HFEndpoint) -> None:
    """The first pull downloads; the second finds it up to date; with the Hub unreachable or offline mode on, the
    cached model is what pull gives (exit 0, and it says so). A name only the HF cache has is suggested."""
    env = _env(hub)
    first = run("pull", f"{MAIN}:Q8_0", env=env)
    assert first.returncode == 0 and "downloaded" in first.stderr, first.stderr
    path = first.stdout.strip()
    again = run("pull", f"{MAIN}:Q8_0", env=env)
    assert again.returncode == 0 and "up to date" in again.stderr and again.stdout.strip() == path
    dead = _env(hub, HF_ENDPOINT="http://127.0.0.1:9")  # nothing listens there
    for env_ in (dead, _env(hub, HF_HUB_OFFLINE="1")):
        cached = run("pull", f"{MAIN}:Q8_0", env=env_)
        assert cached.returncode == 0, cached.stderr
        assert "already in the Hugging Face cache; nothing was downloaded" in cached.stderr
        assert cached.stdout.strip() == path
    missing = run("pull", "ux-org/Not-Cached-GGUF", env=dead)
    assert missing.returncode == 1 and "where the Hub (or $HF_ENDPOINT) can be reached" in missing.stderr
    assert "HF_HUB_OFFLINE" not in missing.stderr and "offline=False" not in missing.stderr  # it is not on
    offline = run("pull", "ux-org/Not-Cached-GGUF", env=_env(hub, HF_HUB_OFFLINE="1"))
    assert offline.returncode == 1 and "unset HF_HUB_OFFLINE" in offline.stderr
    assert "offline=False" not in offline.stderr  # a Python keyword: no such flag here
    typo = run("plan", MAIN[:-4] + "GUFF", env=dead)  # a repo close to a cached one
    assert typo.returncode == 1 and f"Did you mean '{MAIN}:Q8_0' (cached)?" in typo.stderr, typo.stderr
    bare = run("plan", MAIN.split("/")[1], env=dead)  # the repo's name alone: no models-dir file has it
    assert bare.returncode == 1 and f"Did you mean '{MAIN}:Q8_0'?" in bare.stderr, bare.stderr


def test_the_library_leaves_no_resource_warning(smollm2_path: Path, minilm_path: Path) -> None:
    """A script's sync and async calls (`asyncio.run` twice: two event loops) under ``-X dev -W always``: the
    servers it leaves running for others, its connections and the loops' clients raise no ResourceWarning."""
    script = f"""
import asyncio
from gguf_provider import ChatGGUF, GGUFEmbeddings
llm = ChatGGUF(model={str(smollm2_path)!r}, max_tokens=4, keep_alive=0)
llm.invoke("hi")
asyncio.run(llm.ainvoke("hi"))
asyncio.run(llm.ainvoke("hello"))
emb = GGUFEmbeddings(model={str(minilm_path)!r}, keep_alive=0)
emb.embed_query("x")
asyncio.run(emb.aembed_query("x"))
print("done")
"""
    out = subprocess.run([sys.executable, "-X", "dev", "-W", "always", "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout == "done\n", out.stderr
    assert not [w for w in LEAKS if w in out.stderr], out.stderr
