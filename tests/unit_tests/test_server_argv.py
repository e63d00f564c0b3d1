"""The llama-server command line built from a spec: identity marker, safety flags, no secrets, --rpc."""

from __future__ import annotations

from pathlib import Path

import pytest

from gguf_provider.runtime._common.process import Address, clean_env
from gguf_provider.runtime._install.discovery import ServerCapabilities
from gguf_provider.runtime._serve.argv import build_argv
from gguf_provider.runtime._serve.server_options import ServerSpec

CAPS = ServerCapabilities(path="llama-server", version="test", flags={
    "--jinja": True, "--no-webui": True, "--offline": True, "--kv-unified": True, "--api-key-file": True})


def test_unix_socket_argv_has_marker_and_safety_flags() -> None:
    spec = ServerSpec(model=Path("/m/model.gguf"), n_parallel=2, rpc_servers=("10.0.0.2:50052", "10.0.0.3:50052"),
                      chat_template_file="/t/tpl.jinja", embedding=True)
    argv = build_argv(spec, Path("/bin/llama-server"), CAPS, "gguf-provider-abc", 4096,
                      Address(socket="/run/x.sock"), None)
    aliases = [argv[i + 1] for i, a in enumerate(argv) if a == "--alias"]
    assert aliases == ["model", "gguf-provider-abc"]  # /v1/models names the model; the marker is kept, last
    assert argv[argv.index("-c") + 1] == "4096"
    assert argv[argv.index("--host") + 1] == "/run/x.sock" and "--port" not in argv
    assert {"--jinja", "--no-webui", "--offline", "--kv-unified"} <= set(argv)
    assert argv[argv.index("--rpc") + 1] == "10.0.0.2:50052,10.0.0.3:50052"
    assert argv[argv.index("--pooling") + 1] == "mean"
    assert argv[argv.index("--chat-template-file") + 1] == "/t/tpl.jinja"


def test_tcp_argv_passes_the_key_by_file_only(tmp_path: Path) -> None:
    key_file = tmp_path / "k.key"
    address = Address(url="http://127.0.0.1:43210", api_key="s3cret-key")
    argv = build_argv(ServerSpec(model=Path("/m.gguf")), Path("/bin/llama-server"), CAPS, "a", 512, address, key_file)
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "43210"
    assert argv[argv.index("--api-key-file") + 1] == str(key_file)
    assert not any("s3cret" in a for a in argv)
    assert "--api-key" not in argv


def test_flags_the_binary_lacks_are_not_passed() -> None:
    old = ServerCapabilities(path="llama-server", version="old", flags={})
    argv = build_argv(ServerSpec(model=Path("/m.gguf")), Path("/b"), old, "a", 512, Address(socket="/s"), None)
    assert not {"--jinja", "--no-webui", "--offline"} & set(argv)


def test_llama_arg_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "128")
    monkeypatch.setenv("LLAMA_API_KEY", "leak")
    env = clean_env()
    assert "LLAMA_ARG_CTX_SIZE" not in env and "LLAMA_API_KEY" not in env and "PATH" in env


def test_embedding_server_batches_a_whole_context() -> None:
    argv = build_argv(ServerSpec(model=Path("/m.gguf"), embedding=True), Path("/b"), CAPS, "a", 4096,
                      Address(socket="/s"), None)
    assert argv[argv.index("--ubatch-size") + 1] == "4096" == argv[argv.index("--batch-size") + 1]
    mine = ServerSpec(model=Path("/m.gguf"), embedding=True, server_args=("-ub", "256"))
    argv = build_argv(mine, Path("/b"), CAPS, "a", 4096, Address(socket="/s"), None)
    assert "--ubatch-size" not in argv and argv[-2:] == ["-ub", "256"]


@pytest.mark.parametrize("kind", ["embedding", "rerank"])
def test_embedding_and_rerank_servers_keep_the_measured_defaults(kind: str) -> None:
    """As measured (server_options._embedding, bench P15): the build's automatic flash attention and slots stand,
    and no host-RAM prompt cache is asked for (none, or 0)."""
    caps = ServerCapabilities(path="b", version="t", flags={**CAPS.flags, "--flash-attn": True, "--cache-ram": True},
                              choices={"--flash-attn": ["on", "off", "auto"]})
    argv = build_argv(ServerSpec(model=Path("/m.gguf"), **{kind: True}), Path("/b"), caps, "a", 512,
                      Address(socket="/s"), None)
    assert f"--{kind}" in argv
    assert not {"--flash-attn", "-fa", "-np", "--parallel"} & set(argv)
    assert "--cache-ram" not in argv or argv[argv.index("--cache-ram") + 1] == "0"


def test_server_errors_map_to_typed_exceptions() -> None:
    from gguf_provider.client import error_from_body
    from gguf_provider.errors import APIError, ContextOverflowError

    err = error_from_body(400, {"error": {"type": "exceed_context_size_error", "n_prompt_tokens": 900,
                                          "n_ctx": 512, "message": "request exceeds the available context size"}})
    assert isinstance(err, ContextOverflowError) and (err.n_prompt_tokens, err.n_ctx) == (900, 512)
    full = error_from_body(500, {"error": {"code": 500, "message": "Context size has been exceeded."}})
    assert isinstance(full, ContextOverflowError) and "max_tokens" in str(full)
    other = error_from_body(503, {"error": {"code": 503, "message": "Loading model"}})
    assert type(other) is APIError and other.status_code == 503


def test_context_overflow_inside_a_200_stream() -> None:
    """llama-server's ``exceed_context_size_error`` as an event of a 200 stream (its wire shape; the engine refuses
    such prompts before sending them, so a real server does not produce this line here), and the ``error:`` line
    it writes when a stream fails, both raise typed errors from the stream parser."""
    from gguf_provider.client import StreamParser
    from gguf_provider.errors import APIError, ContextOverflowError
    from tests.reliability.sse_capture import ERROR_LINES

    parser = StreamParser()
    assert parser.feed_line('data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}')
    with pytest.raises(ContextOverflowError) as info:
        parser.feed_line(ERROR_LINES[1])
    assert (info.value.n_prompt_tokens, info.value.n_ctx) == (3000, 2048)
    with pytest.raises(APIError, match="slot unavailable"):
        StreamParser().feed_line(ERROR_LINES[0])


@pytest.mark.parametrize(("arch", "pooling_type", "asked", "flag"), [
    ("bert", 1, None, None),  # MiniLM: the header's mean stands
    ("bert", 2, None, None),  # BGE: CLS pooling, not overridden by mean
    ("qwen3", 3, None, None),  # Qwen3-Embedding: last-token pooling
    ("llama", None, None, "mean"),  # a chat model names none: mean, as the OpenAI endpoint needs a pooled vector
    ("llama", 0, None, "mean"),  # `none` cannot serve /v1/embeddings
    ("bert", 2, "mean", "mean"),  # what the user asked wins
    ("llama", None, "last", "last"),
])
def test_embedding_pooling_comes_from_the_header_unless_asked(
        tmp_path: Path, arch: str, pooling_type: int | None, asked: str | None, flag: str | None) -> None:
    from gguf_provider.runtime._common.gguf import read_header
    from tests.support.gguf_bytes import encode, gguf

    kvs = [encode("general.architecture", arch), encode(f"{arch}.context_length", 512)]
    if pooling_type is not None:
        kvs.append(encode(f"{arch}.pooling_type", pooling_type))
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf(*kvs))
    header = read_header(path)
    assert header.pooling_type == pooling_type
    spec = ServerSpec(model=path, embedding=True, pooling=asked)
    argv = build_argv(spec, Path("/b"), CAPS, "a", 512, Address(socket="/s"), None, header_pooling=header.pooling_type)
    assert "--embedding" in argv
    assert (argv[argv.index("--pooling") + 1] if "--pooling" in argv else None) == flag


def test_chat_servers_get_no_pooling_flag() -> None:
    argv = build_argv(ServerSpec(model=Path("/m.gguf")), Path("/b"), CAPS, "a", 512, Address(socket="/s"), None,
                      header_pooling=1)
    assert "--pooling" not in argv and "--embedding" not in argv


def test_an_embedding_input_too_large_for_the_batch_is_a_context_overflow() -> None:
    from gguf_provider.client import error_from_body
    from gguf_provider.errors import ContextOverflowError

    err = error_from_body(500, {"error": {"code": 500, "type": "server_error", "message":
                                          "input (700 tokens) is too large to process. increase the physical batch "
                                          "size (current batch size: 512)"}})
    assert isinstance(err, ContextOverflowError) and (err.n_prompt_tokens, err.n_ctx) == (700, 512)
    assert "truncate=True" in str(err)


# --- speculative decoding and the KV cache type (issue 14) -------------------------------------------------------

SPEC_TYPES = ["none", "draft-simple", "draft-eagle3", "draft-mtp", "ngram-simple", "ngram-map-k", "ngram-map-k4v",
              "ngram-mod", "ngram-cache"]
CACHE = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
SPEC_CAPS = ServerCapabilities(path="llama-server", version="test", flags={
    **CAPS.flags, "--spec-default": True, "--spec-type": True, "--spec-draft-model": True, "--model-draft": True,
    "--cache-type-k": True, "--cache-type-v": True, "--spec-draft-type-k": True, "--spec-draft-type-v": True,
    "--flash-attn": True}, choices={"--spec-type": SPEC_TYPES, "--cache-type-k": CACHE, "--cache-type-v": CACHE,
                                    "--flash-attn": ["on", "off", "auto"]})


def _argv(caps: ServerCapabilities = SPEC_CAPS, **spec: object) -> list[str]:
    return build_argv(ServerSpec(model=Path("/m.gguf"), **spec), Path("/b"), caps, "a", 4096,  # type: ignore[arg-type]
                      Address(socket="/s"), None)


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_speculation_and_cache_flags_are_absent_by_default() -> None:
    argv = _argv()  # a bare ServerSpec: what bench's raw server and old callers build
    assert not [a for a in argv if a.startswith(("--spec", "--cache-type", "--flash-attn", "-md"))]


def test_auto_speculation_is_the_builds_default() -> None:
    assert _argv(speculative="auto")[-1:] == ["--spec-default"]
    no_default = ServerCapabilities(path="b", version="t", flags={**SPEC_CAPS.flags, "--spec-default": False},
                                    choices=SPEC_CAPS.choices)
    argv = _argv(no_default, speculative="auto")
    assert _after(argv, "--spec-type") == "ngram-mod" and "--spec-default" not in argv


def test_an_ngram_type_and_a_draft_model() -> None:
    assert _after(_argv(speculative="ngram-simple"), "--spec-type") == "ngram-simple"
    argv = _argv(speculative="draft", draft_model=Path("/d.gguf"))
    assert _after(argv, "--spec-type") == "draft-simple" and _after(argv, "--spec-draft-model") == "/d.gguf"
    assert "--spec-draft-type-k" not in argv  # f16: the draft's default cache type


def test_user_server_args_come_last_and_win() -> None:
    argv = _argv(speculative="auto", kv_cache_type="q8_0", server_args=("--spec-draft-n-max", "8"))
    assert argv[-2:] == ["--spec-draft-n-max", "8"] and argv.index("--spec-default") < len(argv) - 2


@pytest.mark.parametrize(("cache_type", "fa"), [("q8_0", ["--flash-attn", "on"]), ("q4_0", ["--flash-attn", "on"]),
                                                ("f32", []), ("bf16", [])])
def test_cache_type_sets_k_and_v_and_flash_attention_for_quantized_v(cache_type: str, fa: list[str]) -> None:
    argv = _argv(kv_cache_type=cache_type)
    assert _after(argv, "--cache-type-k") == cache_type == _after(argv, "--cache-type-v")
    i = argv.index("--flash-attn") if "--flash-attn" in argv else None
    assert (argv[i:i + 2] if i is not None else []) == fa


def test_old_builds_get_their_spellings() -> None:
    old = ServerCapabilities(path="b", version="old", flags={
        "--model-draft": True, "--cache-type-k": True, "--cache-type-k-draft": True, "--cache-type-v-draft": True,
        "--flash-attn": True})  # no --spec-*, a bare -fa switch, no listed values
    argv = _argv(old, speculative="draft", draft_model=Path("/d.gguf"), kv_cache_type="q8_0")
    assert _after(argv, "--model-draft") == "/d.gguf" and "--spec-type" not in argv
    assert _after(argv, "--cache-type-k-draft") == "q8_0" == _after(argv, "--cache-type-v-draft")
    assert argv[argv.index("--flash-attn") + 1] != "on"


def test_a_draft_with_a_quantized_cache_quantizes_the_drafts_cache_too() -> None:
    argv = _argv(speculative="draft", draft_model=Path("/d.gguf"), kv_cache_type="q8_0")
    assert _after(argv, "--spec-draft-type-k") == "q8_0" == _after(argv, "--spec-draft-type-v")


def test_a_build_without_speculation_gets_no_flags() -> None:
    from gguf_provider.runtime._serve import speculative

    for mode in ("auto", "ngram-mod"):
        assert not [a for a in _argv(CAPS, speculative=mode) if a.startswith("--spec")]
        assert speculative.unsupported(mode, CAPS)
    assert speculative.unsupported("auto", SPEC_CAPS) is None


def test_speculation_and_cache_type_are_part_of_the_server_identity(tmp_path: Path) -> None:
    model, binary = tmp_path / "m.gguf", tmp_path / "llama-server"
    model.write_bytes(b"GGUF")
    binary.write_bytes(b"#!")
    base = ServerSpec(model=model, speculative="auto")
    families = {base.family(binary)}
    for other in (ServerSpec(model=model), ServerSpec(model=model, speculative="ngram-simple"),
                  ServerSpec(model=model, speculative="auto", kv_cache_type="q8_0"),
                  ServerSpec(model=model, speculative="draft", draft_model=model)):
        families.add(other.family(binary))
    assert len(families) == 5  # each setting is another server
    # the context alone does not change the family (a larger server of the same family is shared)
    assert ServerSpec(model=model, speculative="auto", n_ctx=2048).family(binary) == base.family(binary)


# --- each server option declared once (runtime/_serve/server_options.py) ------------------------------------------------


def test_the_typed_fields_agree_with_the_declarations() -> None:
    """EngineConfig and ServerSpec carry a field per declared option (mypy reads fields, not the table), with the
    declared default; ServerSpec holds a resolved option as what it resolved to (and a bare spec speculates only
    when asked)."""
    import dataclasses

    from gguf_provider.engine import EngineConfig
    from gguf_provider.runtime._serve import server_options

    config = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    spec = {f.name: f.default for f in dataclasses.fields(ServerSpec)}
    for o in server_options.OPTIONS:
        want = tuple(o.default) if isinstance(o.default, list) else o.default
        assert o.name in config and config[o.name] == want, o.name
        if o.name == "vision":
            assert o.name not in spec  # it resolves to the spec's mmproj
        elif o.name == "speculative":
            assert spec[o.name] == "off"
        else:
            assert o.name in spec and spec[o.name] == want, o.name
    assert set(spec) - set(server_options.BY_NAME) == {"model", "shards", "draft_model", "draft_shards"}


def test_the_adapters_server_fields_are_made_from_the_declarations() -> None:
    from gguf_provider import ChatGGUF, GGUFEmbeddings
    from gguf_provider.runtime._serve import server_options

    for o in server_options.OPTIONS:
        for cls, has in ((ChatGGUF, o.group in ("server", "chat")),
                         (GGUFEmbeddings, o.group in ("server", "embedding"))):
            assert (o.name in cls.model_fields) == has, (cls.__name__, o.name)
            if has:
                f = cls.model_fields[o.name]
                assert f.description == o.description and f.annotation == o.type, o.name
                assert (f.default_factory() if f.default_factory else f.default) == (  # type: ignore[call-arg]
                    o.factory() if o.factory else o.default), o.name


def test_what_an_option_needs_is_what_the_probe_reads() -> None:
    from gguf_provider.runtime._install import discovery
    from gguf_provider.runtime._serve import server_options

    needed = {flag for o in server_options.OPTIONS for flag in o.needs}
    assert needed and needed <= set(discovery.OPTIONAL_FLAGS)


def test_a_wrong_value_is_refused_by_the_same_check_everywhere() -> None:
    from gguf_provider import ChatGGUF
    from gguf_provider.engine import EngineConfig

    for make in (lambda: EngineConfig(model="m", kv_cache_type="q9_0"), lambda: ChatGGUF(model="m", kv_cache_type="q9_0")):
        with pytest.raises(ValueError, match="did you mean 'q8_0'"):
            make()
    assert EngineConfig(model="m", kv_cache_type=" Q8_0 ").kv_cache_type == "q8_0"
    assert ChatGGUF(model="m", rpc_servers="h:1, h:2").rpc_servers == ["h:1", "h:2"]


def test_the_family_leaves_out_the_context_by_name(tmp_path: Path) -> None:
    from gguf_provider.runtime._serve import server_options

    model, binary = tmp_path / "m.gguf", tmp_path / "llama-server"
    model.write_bytes(b"GGUF")
    binary.write_bytes(b"#!")
    assert [o.name for o in server_options.OPTIONS if not o.family] == ["n_ctx"]
    ident = ServerSpec(model=model, n_ctx=1234, n_gpu_layers=5).identity(binary)
    assert dict(zip([o.name for o in server_options.ARGS], ident["args"], strict=True))["n_ctx"] == 1234


def test_the_summary_names_what_differs_from_the_defaults() -> None:
    from gguf_provider.runtime._serve import server_options

    spec = ServerSpec(model=Path("/m.gguf"), n_ctx=2048, rpc_servers=("h:1",), kv_cache_type="q8_0",
                      mmproj=Path("/p.gguf"))
    assert server_options.summary(spec) == {"n_ctx": 2048, "rpc_servers": ["h:1"], "kv_cache_type": "q8_0",
                                            "mmproj": "/p.gguf"}
    assert server_options.summary(ServerSpec(model=Path("/m.gguf"))) == {}


def test_ps_shows_the_options_the_registry_recorded() -> None:
    from gguf_provider.runtime import ServerStatus
    from gguf_provider.runtime._serve import server_options
    from gguf_provider.runtime._serve.registry import Entry

    spec = ServerSpec(model=Path("/m.gguf"), n_ctx=2048, rpc_servers=("h:1",), kv_cache_type="q8_0", n_gpu_layers=9)
    entry = Entry(pid=1, create_time=2.5, alias="gguf-provider-x", socket="/s.sock",
                  options=server_options.summary(spec))
    again = Entry.from_json(entry.to_json())
    assert again is not None and again.options == {"n_ctx": 2048, "n_gpu_layers": 9, "rpc_servers": ["h:1"],
                                                    "kv_cache_type": "q8_0"}
    older = entry.to_json()
    del older["options"]  # an entry written before options were recorded
    assert Entry.from_json(older) is not None and Entry.from_json(older).options == {}  # type: ignore[union-attr]
    row = ServerStatus(id="x", pid=1, model="/m.gguf", ctx=2048, address="unix:/s.sock", rss=0, leases=1, idle_s=0,
                       shared=True, memory=0, charge=0, last_used=0.0, holders=(1,), workers=("h:1",),
                       options=again.options)
    assert row.describe_options() == "n_gpu_layers=9 kv_cache_type=q8_0"  # the context and workers have columns
