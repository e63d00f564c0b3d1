"""Features follow the binary, not the pin: the ``--help`` of four real llama-server builds spanning two years
(tests/unit_tests/data/llama_server_help/, captured from CPU builds of the llama.cpp trees vendored in
llama-cpp-python's sdists on PyPI: 0.3.2 = llama.cpp 74d73dc of 2024-11-15, 0.3.16 = 4227c9b of 2025-08-14, 0.3.26 =
7c158fb of 2026-06-04, and our pin 0.3.36). Every flag a start writes is one the build lists; what it lacks is left
out (optimisations) or refused by name (what the user asked for)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gguf_provider.errors import BuildFeatureWarning
from gguf_provider.runtime._common.process import Address
from gguf_provider.runtime._install import discovery
from gguf_provider.runtime._serve import features
from gguf_provider.runtime._serve.argv import build_argv
from gguf_provider.runtime._serve.server_options import ServerSpec

HELP = Path(__file__).parent / "data" / "llama_server_help"
BUILDS = sorted(p.stem for p in HELP.glob("*.txt"))


def caps(build: str) -> discovery.ServerCapabilities:
    return discovery.from_help(f"/builds/{build}/llama-server", "version: 1 (test)", (HELP / f"{build}.txt").read_text())


def listed(build: str, flag: str) -> bool:
    return re.search(rf"(^|[\s,]){re.escape(flag)}([\s,=]|$)", (HELP / f"{build}.txt").read_text(), re.M) is not None


def test_the_captured_builds_span_two_years() -> None:
    assert len(BUILDS) >= 4 and {"llama-cpp-python-0.3.2", "llama-cpp-python-0.3.36"} <= set(BUILDS)


SPECS = {
    "chat": dict(),
    "chat, two slots, q8_0 cache, a projector": dict(n_parallel=2, kv_cache_type="q8_0", mmproj=Path("/p.gguf")),
    "embedding": dict(embedding=True, speculative="off"),
    "rerank": dict(rerank=True, speculative="off"),
    "RPC workers": dict(rpc_servers=("10.0.0.2:50052",)),
}


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("name", SPECS)
def test_a_start_writes_only_flags_the_build_lists(build: str, name: str) -> None:
    c = caps(build)
    spec = ServerSpec(model=Path("/m.gguf"), **SPECS[name])  # type: ignore[arg-type]
    try:
        features.check(spec, c)
    except ValueError:
        return  # refused by name (below), so nothing is written
    unix = c.flags[discovery.UNIX_SOCKET]
    address = Address(socket="/run/x.sock") if unix else Address(url="http://127.0.0.1:8080", api_key="k")
    argv = build_argv(spec, Path(f"/builds/{build}/llama-server"), c, "~gguf-provider-x", 4096, address,
                      None if unix else Path("/run/x.key"), slot_save_path=Path("/cache"), threads=2)
    written = [a for a in argv[1:] if re.fullmatch(r"--?[a-z][a-z-]*", a)]
    assert written and [f for f in written if not listed(build, f)] == []


@pytest.mark.parametrize("build", BUILDS)
def test_what_the_user_asks_for_is_refused_by_name_where_the_build_lacks_it(build: str) -> None:
    c = caps(build)
    asked = {"reasoning_format": ("none", "--reasoning-format"), "chat_template_file": ("/t.jinja", "--chat-template-file"),
             "rerank": (True, "--rerank"), "kv_cache_type": ("q8_0", "--cache-type-k"), "cache_reuse": (256, "--cache-reuse"),
             "rpc_servers": (("h:1",), "--rpc")}
    for option, (value, flag) in asked.items():
        spec = ServerSpec(model=Path("/m.gguf"), **{option: value})  # type: ignore[arg-type]
        if listed(build, flag):
            features.check(spec, c)
        else:
            with pytest.raises(ValueError, match=rf"{option}=.* needs a llama-server with .*{flag}.*server install"):
                features.check(spec, c)
    ngram = ServerSpec(model=Path("/m.gguf"), speculative="ngram-mod")
    if "ngram-mod" in c.allowed("--spec-type"):
        features.check(ngram, c)
    else:
        with pytest.raises(ValueError, match="speculative='ngram-mod' needs a newer llama-server"):
            features.check(ngram, c)
    features.check(ServerSpec(model=Path("/m.gguf")), c)  # the defaults run on every build


EXPECTED_MISSING = {  # the optimisations each build lacks, in features.OPTIMISATIONS' order
    "llama-cpp-python-0.3.2": ["--kv-unified", "--fit", "--jinja", "--no-webui", "--offline"],
    "llama-cpp-python-0.3.36": [],
}


@pytest.mark.parametrize("build", BUILDS)
def test_the_optimisations_a_build_lacks_are_said_in_one_line(build: str, recwarn: pytest.WarningsRecorder) -> None:
    c = caps(build)
    missing = features.missing_optimisations(c)
    assert missing == [f for f in features.OPTIMISATIONS if not listed(build, f)]
    if build in EXPECTED_MISSING:
        assert missing == EXPECTED_MISSING[build]
    features._said.discard(c.path)
    features.say_dropped(c, c.path)
    features.say_dropped(c, c.path)  # once per binary
    lines = [w for w in recwarn if issubclass(w.category, BuildFeatureWarning)]
    assert len(lines) == (1 if missing else 0)
    if missing:
        assert all(f in str(lines[0].message) for f in missing)


def test_unix_sockets_and_the_reasoning_budget_follow_the_build() -> None:
    assert caps("llama-cpp-python-0.3.2").flags[discovery.UNIX_SOCKET] is False  # TCP and a key file there
    assert caps("llama-cpp-python-0.3.36").flags[discovery.UNIX_SOCKET] is True
    for build in BUILDS:
        c = caps(build)
        ask = {"messages": [], "reasoning_budget_tokens": 64}
        if c.supports("--reasoning-budget"):
            features.request_needs(ask, c.flags, "m.gguf")
        else:
            with pytest.raises(ValueError, match="reasoning_budget needs a llama-server with --reasoning-budget"):
                features.request_needs(ask, c.flags, "m.gguf")
        features.request_needs({"messages": []}, c.flags, "m.gguf")
    features.request_needs({"reasoning_budget_tokens": 64}, {}, "m.gguf")  # a server we did not start: not judged


def test_a_build_without_the_core_flags_is_refused() -> None:
    c = discovery.from_help("/bin/llama", "version: 1", "usage: llama [options]\n  -h, --help\n")
    with pytest.raises(ValueError, match="no --model, --ctx-size, --host, --port, --alias .* no llama-server"):
        features.check(ServerSpec(model=Path("/m.gguf")), c)
