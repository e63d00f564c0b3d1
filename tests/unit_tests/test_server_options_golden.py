"""The llama-server command line and the server identity, for a table of option sets, exactly as captured before
the server options were declared in one place (gguf_provider/runtime/_serve/server_options.py): the refactor moved no flag
and no identity hash. Recaptured when `cache_reuse` joined (issue 31): `--cache-reuse` in chat argv, one more arg.

Each case goes the whole way a config goes: ``EngineConfig`` → ``resolve_spec`` (real local model files,
written here) → ``ServerSpec.identity`` / ``family`` and ``build_argv`` for fixed build capabilities. The files live
in a fixed directory, so the identity's paths, and the hashes made of them, are the same on every run.

``python -m tests.unit_tests.test_server_options_golden --write`` captures the table again (only when the change is
meant to move flags or identities).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from gguf_provider.engine import EngineConfig
from gguf_provider.runtime._common.process import Address
from gguf_provider.runtime._install.discovery import ServerCapabilities
from gguf_provider.runtime._serve.argv import build_argv
from gguf_provider.runtime._serve.config import resolve_spec
from tests.support.gguf_bytes import encode, gguf, rich_header, string

GOLDEN = Path(__file__).parent / "data" / "server_argv_golden.json"
ROOT = Path("/tmp/gguf-provider-golden-v1")  # fixed: the identity holds absolute paths
MTIME_NS = 1_700_000_000_123_456_789

SPEC_TYPES = ["none", "draft-simple", "ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache"]
CACHE = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
# A current build (every flag, listed values), one from before --spec-* (old spellings, a bare -fa switch), and one
# with no optional flag at all.
CAPS = {
    "new": ServerCapabilities(path="/golden/bin/llama-server", version="b7000", flags={
        "--jinja": True, "--no-webui": True, "--offline": True, "--kv-unified": True, "--api-key-file": True,
        "--spec-default": True, "--spec-type": True, "--spec-draft-model": True, "--model-draft": True,
        "--cache-type-k": True, "--cache-type-v": True, "--spec-draft-type-k": True, "--spec-draft-type-v": True,
        "--flash-attn": True, "--rpc": True, "--mmproj": True, "--embedding": True, "--pooling": True,
        "--cache-reuse": True},
        choices={"--spec-type": SPEC_TYPES, "--cache-type-k": CACHE, "--cache-type-v": CACHE,
                 "--flash-attn": ["on", "off", "auto"]}),
    "old": ServerCapabilities(path="/golden/bin/llama-server", version="b4000", flags={
        "--jinja": True, "--model-draft": True, "--cache-type-k": True, "--cache-type-v": True,
        "--cache-type-k-draft": True, "--cache-type-v-draft": True, "--flash-attn": True}),
    "bare": ServerCapabilities(path="/golden/bin/llama-server", version="b1000"),
}
ADDRESSES = {"socket": Address(socket="/golden/run/x.sock"),
             "tcp": Address(url="http://127.0.0.1:43210", api_key="not-in-argv")}

# name: (EngineConfig keyword arguments (file names relative to ROOT), how the argv is built)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "defaults": ({}, {}),
    "defaults-bare-build": ({}, {"caps": "bare"}),
    "defaults-old-build": ({}, {"caps": "old"}),
    "n_ctx": ({"n_ctx": 2048}, {"n_ctx": 2048}),
    "n_gpu_layers": ({"n_gpu_layers": 12}, {}),
    "n_gpu_layers-zero": ({"n_gpu_layers": 0}, {}),
    "n_parallel": ({"n_parallel": 4}, {}),
    "n_parallel-bare-build": ({"n_parallel": 4}, {"caps": "bare"}),
    "chat_template": ({"chat_template": "chatml"}, {}),
    "chat_template_file": ({"chat_template_file": "/golden/tpl.jinja"}, {}),
    "reasoning_format": ({"reasoning_format": "deepseek"}, {}),
    "rpc_servers": ({"rpc_servers": "10.0.0.2:50052, 10.0.0.3:50053"}, {}),
    "rpc_servers-with-layers": ({"rpc_servers": ("[::1]:50052",), "n_gpu_layers": 5}, {}),
    "server_args": ({"server_args": ("-t", "2", "--no-mmap")}, {}),
    "port-tcp": ({"port": 8080}, {"address": "tcp", "api_key_file": "/golden/run/x.key"}),
    "speculative-off": ({"speculative": False}, {}),
    "speculative-ngram": ({"speculative": "ngram-simple"}, {}),
    "speculative-auto-old-build": ({"speculative": "auto"}, {"caps": "old"}),
    "speculative-draft": ({"speculative": "draft.gguf"}, {}),
    "speculative-draft-q8-old-build": ({"speculative": "draft.gguf", "kv_cache_type": "Q8_0"}, {"caps": "old"}),
    "kv_cache_type-q8_0": ({"kv_cache_type": "q8_0"}, {}),
    "kv_cache_type-q4_0-old-build": ({"kv_cache_type": "q4_0"}, {"caps": "old"}),
    "kv_cache_type-bf16": ({"kv_cache_type": "bf16"}, {}),
    "kv_cache_type-draft-q8_0": ({"speculative": "draft.gguf", "kv_cache_type": "q8_0"}, {}),
    "embedding": ({"embedding": True, "model_path": "embed.gguf"}, {"n_ctx": 512, "header_pooling": 1}),
    "embedding-chat-model": ({"embedding": True}, {"n_ctx": 16384}),
    "embedding-pooling": ({"embedding": True, "pooling": "cls", "model_path": "embed.gguf"},
                          {"header_pooling": 1}),
    "embedding-own-ubatch": ({"embedding": True, "server_args": ("--ubatch-size=256",)}, {}),
    "embedding-ignores-speculative": ({"embedding": True, "speculative": "ngram-mod", "kv_cache_type": "q8_0"},
                                      {}),
    "mmproj": ({"mmproj": "mmproj.gguf"}, {}),
    "vision": ({"vision": True, "model_path": "vision/model.gguf"}, {}),
    "cache_reuse-256": ({"cache_reuse": 256}, {}),
    "cache_reuse-off": ({"cache_reuse": 0}, {}),
    "cache_reuse-recurrent-model": ({}, {"recurrent": True}),
    "not-identity": ({"keep_alive": 0, "shared": False, "timeout": 5.0, "start_timeout": 9.0, "max_retries": 0,
                      "llama_server": "/elsewhere/llama-server"}, {}),
    "everything": ({"n_ctx": 8192, "n_gpu_layers": 99, "n_parallel": 2, "chat_template_file": "/golden/t.jinja",
                    "reasoning_format": "none", "rpc_servers": ("h:1",), "server_args": ("-ub", "1024"),
                    "port": 0, "speculative": "ngram-mod", "kv_cache_type": "q5_1", "mmproj": "mmproj.gguf"},
                   {"address": "tcp", "api_key_file": "/golden/run/y.key", "n_ctx": 8192}),
}


def _write(path: Path, data: bytes) -> None:
    """The file with exactly these bytes and mtime (atomically: parallel runs may write it at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not (path.is_file() and path.read_bytes() == data and path.stat().st_mtime_ns == MTIME_NS):
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_bytes(data)
        os.utime(tmp, ns=(MTIME_NS, MTIME_NS))
        os.replace(tmp, path)


def files() -> Path:
    """The binary and the models the cases name, under :data:`ROOT`; returns the binary."""
    _write(ROOT / "model.gguf", rich_header())
    _write(ROOT / "draft.gguf", rich_header())  # the same vocabulary: it can draft
    _write(ROOT / "embed.gguf", gguf(encode("general.architecture", "bert"), encode("bert.context_length", 512),
                                     encode("bert.pooling_type", 1)))
    clip = gguf(string("general.architecture", "clip"))
    _write(ROOT / "mmproj.gguf", clip)
    _write(ROOT / "vision" / "model.gguf", rich_header())
    _write(ROOT / "vision" / "mmproj-model-f16.gguf", clip)
    binary = ROOT / "bin" / "llama-server"
    _write(binary, b"#!/bin/sh\n")
    return binary


def _config(kwargs: dict[str, Any]) -> EngineConfig:
    kwargs = dict(kwargs)
    for key in ("model_path", "mmproj"):
        if key in kwargs:
            kwargs[key] = str(ROOT / kwargs[key])
    if str(kwargs.get("speculative", "")).endswith(".gguf"):
        kwargs["speculative"] = str(ROOT / kwargs["speculative"])
    kwargs.setdefault("model_path", str(ROOT / "model.gguf"))
    return EngineConfig(**kwargs)


def compute(name: str) -> dict[str, Any]:
    binary = files()
    config, call = CASES[name]
    spec = resolve_spec(_config(config))
    ident = spec.identity(binary)
    key_file = call.get("api_key_file")
    argv = build_argv(spec, binary, CAPS[call.get("caps", "new")], "gguf-provider-golden", call.get("n_ctx", 4096),
                      ADDRESSES[call.get("address", "socket")], Path(key_file) if key_file else None,
                      header_pooling=call.get("header_pooling"), recurrent=call.get("recurrent", False))
    return {"argv": argv, "identity": ident,
            "key": hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24],
            "family": spec.family(binary)}


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    if Path("/tmp").resolve() != Path("/tmp"):
        pytest.skip("the captured identities hold /tmp paths; here /tmp is a link (macOS: /private/tmp)")
    data: dict[str, Any] = json.loads(GOLDEN.read_text())
    return data


def test_every_case_is_captured(golden: dict[str, Any]) -> None:
    assert sorted(golden) == sorted(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_argv_and_identity_are_as_captured(golden: dict[str, Any], name: str) -> None:
    got = json.loads(json.dumps(compute(name)))  # tuples as lists, as in the file
    want = golden[name]
    assert got["argv"] == want["argv"]
    assert got["identity"] == want["identity"]
    assert (got["key"], got["family"]) == (want["key"], want["family"])


def test_the_cases_differ_where_they_should(golden: dict[str, Any]) -> None:
    """The table itself is no accident: settings outside the identity share a server, the context alone keeps the
    family, and everything else is another server."""
    assert golden["not-identity"]["key"] == golden["defaults"]["key"]
    assert golden["n_ctx"]["family"] == golden["defaults"]["family"] != golden["n_gpu_layers"]["family"]
    assert golden["n_ctx"]["key"] != golden["defaults"]["key"]
    # cache reuse: on by default where the build has it, another server when off
    assert golden["defaults"]["argv"][-3:-1] == ["--cache-reuse", "64"]
    assert "--cache-reuse" not in golden["cache_reuse-off"]["argv"] + golden["defaults-old-build"]["argv"]
    assert golden["cache_reuse-off"]["family"] != golden["defaults"]["family"]


def main(argv: list[str]) -> int:
    if "--write" not in argv:
        print(__doc__)
        return 2
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps({name: compute(name) for name in CASES}, indent=1) + "\n")
    print(f"wrote {GOLDEN} ({len(CASES)} cases)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
