"""Issue 14 offline: `speculative=` and `kv_cache_type=` are validated where they are given (typos are errors, not
silently different servers), read the build's --help, check a draft's vocabulary from the GGUF headers, size the
KV cache by type in the fit and the budget, and drafted/accepted tokens reach the adapters' metadata."""

from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from llama_index.core.base.llms.types import ChatMessage

from gguf_provider import ChatGGUF, GGUFEmbeddings
from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.errors import DraftModelMismatchError, SpeculationWarning
from gguf_provider.llama_index import GGUF, GGUFEmbedding
from gguf_provider.options import UnknownOptionWarning
from gguf_provider.runtime._common.gguf import read_header, read_vocabulary
from gguf_provider.runtime._install.discovery import ServerCapabilities, help_choices
from gguf_provider.runtime._memory import fit
from gguf_provider.runtime._serve import budget, speculative
from gguf_provider.runtime._serve.server_options import check_cache_type
from tests.support import gguf_bytes as gb
from tests.support.replay import BASE_URL, load_replay

# Excerpts of the pinned build's `llama-server --help`, as printed.
HELP = """\
-fa,   --flash-attn [on|off|auto]       set Flash Attention use ('on', 'off', or 'auto', default: 'auto')
                                        (env: LLAMA_ARG_FLASH_ATTN)
-ctk,  --cache-type-k TYPE              KV cache data type for K
                                        allowed values: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1
                                        (default: f16)
-ctv,  --cache-type-v TYPE              KV cache data type for V
                                        allowed values: f32, f16, q8_0
                                        (default: f16)
--spec-draft-type-k, -ctkd, --cache-type-k-draft TYPE
                                        KV cache data type for K for the draft model
                                        allowed values: f32, f16
--draft, --draft-n, --draft-max N       the argument has been removed. use --spec-draft-n-max or
                                        --spec-ngram-mod-n-max
--spec-type none,draft-simple,draft-eagle3,draft-mtp,ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,ngram-cache
                                        comma-separated list of types of speculative decoding to use (default:
                                        none)
--spec-default                          enable default speculative decoding config
"""
CAPS = ServerCapabilities(path="/bin/llama-server", version="t", flags={
    "--spec-default": True, "--spec-type": True, "--cache-type-k": True},
    choices={f: help_choices(HELP, f) for f in ("--spec-type", "--cache-type-k", "--flash-attn")})
CHAT = [ChatGGUF, GGUF]


def test_help_lists_are_read_per_flag() -> None:
    assert help_choices(HELP, "--flash-attn") == ["on", "off", "auto"]
    assert help_choices(HELP, "--cache-type-k")[3:5] == ["q8_0", "q4_0"]
    assert help_choices(HELP, "--cache-type-v") == ["f32", "f16", "q8_0"]  # its own entry, not K's
    assert help_choices(HELP, "--cache-type-k-draft") == ["f32", "f16"]  # an alias of the draft's entry
    assert "ngram-mod" in help_choices(HELP, "--spec-type") and help_choices(HELP, "--spec-type")[0] == "none"
    assert help_choices(HELP, "--spec-default") == [] and help_choices(HELP, "--spec-draft-n-max") == []


# --- values, checked where they are given ------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "mode"), [
    (True, "auto"), ("auto", "auto"), ("ngram", "auto"), ("on", "auto"), (False, "off"), (None, "off"),
    ("off", "off"), ("none", "off"), ("NGRAM-Simple", "ngram-simple"), ("org/repo:Q4_K_M", "org/repo:Q4_K_M"),
    ("~/draft.gguf", "~/draft.gguf")])
def test_speculative_values_normalize(value: Any, mode: str) -> None:
    assert speculative.normalize(value) == mode
    assert EngineConfig(model="m", speculative=value).speculative == mode


@pytest.mark.parametrize("cls", CHAT, ids=lambda c: c.__name__)
@pytest.mark.parametrize(("option", "bad", "match"), [
    ("speculative", "draft-simple", "needs its draft model"), ("speculative", 3, "not int"),
    ("kv_cache_type", 8, "must be a string"),
    ("kv_cache_type", "q8", r"did you mean 'q8_0'"), ("kv_cache_type", "fp16", "not a KV cache type")])
def test_bad_values_fail_at_construction(cls: type[Any], option: str, bad: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cls(model="m", **{option: bad})
    with pytest.raises(ValueError, match=match):
        EngineConfig(model="m", **{option: bad})


@pytest.mark.parametrize("cls", CHAT, ids=lambda c: c.__name__)
def test_a_misspelled_option_name_warns_with_the_right_one(cls: type[Any]) -> None:
    with pytest.warns(UnknownOptionWarning, match=r"'speculatve' \(did you mean 'speculative'\?\)"):
        cls(model="m", speculatve=False)
    with pytest.warns(UnknownOptionWarning, match=r"'kv_cache_typ' \(did you mean 'kv_cache_type'\?\)"):
        cls(model="m", kv_cache_typ="q8_0")


@pytest.mark.parametrize("cls", [*CHAT, GGUFEmbeddings, GGUFEmbedding], ids=lambda c: c.__name__)
def test_the_options_reach_the_engine(cls: type[Any]) -> None:
    chat = cls in CHAT
    extra = {"speculative": "ngram-simple"} if chat else {}
    config = cls(model="m", kv_cache_type="Q4_0", **extra).engine_config()
    assert config.kv_cache_type == "q4_0" and config.speculative == ("ngram-simple" if chat else "auto")
    assert cls(model="m").engine_config().kv_cache_type == "f16"
    if chat:
        assert cls(model="m").engine_config().speculative == "auto"  # the default
        assert cls(model="m", speculative=False).engine_config().speculative == "off"


def test_the_build_decides_which_ngram_types_exist() -> None:
    speculative.check_type("ngram-map-k4v", CAPS)
    with pytest.raises(ValueError, match=r"not an n-gram type of this llama-server \(did you mean 'ngram-mod'\?\)"):
        speculative.check_type("ngram-mdo", CAPS)


def test_the_build_and_the_model_decide_which_cache_types_work(tmp_path: Path) -> None:
    header = read_header(gb.STANDINS["qwen"].write(tmp_path))  # head size 64
    check_cache_type("q4_1", CAPS, header)
    only_f16 = ServerCapabilities(path="b", version="t", flags={"--cache-type-k": True},
                                  choices={"--cache-type-k": ["f32", "f16"]})
    with pytest.raises(ValueError, match=r"kv_cache_type='q8_0' is not a KV cache type of this llama-server \(it "
                                         r"lists f32, f16"):
        check_cache_type("q8_0", only_f16, header)
    odd = tmp_path / "odd.gguf"  # head size 80 (phi-2-like): 32-element blocks do not divide it
    odd.write_bytes(gb.gguf(*(gb.encode(k, v) for k, v in {
        "general.architecture": "phi2", "phi2.block_count": 2, "phi2.embedding_length": 2560,
        "phi2.attention.head_count": 32}.items())))
    with pytest.raises(ValueError, match=r"blocks of 32 values, which do not divide odd.gguf's attention head size "
                                         r"\(80\); use f16"):
        check_cache_type("q8_0", CAPS, read_header(odd))
    check_cache_type("bf16", CAPS, read_header(odd))


def test_a_build_without_speculation_is_said_once() -> None:
    speculative._warned.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")  # count what we emit, not what Python's own once-per-line filter lets by
        for _ in range(3):
            speculative.warn_once("no speculation here", "/bin/old")
        speculative.warn_once("no speculation here", "/bin/other")
    assert [type(w.message) for w in seen] == [SpeculationWarning, SpeculationWarning]


# --- the draft's vocabulary --------------------------------------------------------------------------------------


def _vocab_model(path: Path, tokens: list[str], *, model: str = "gpt2", bos: int = 1, eos: int = 2,
                 add_bos: bool | None = None) -> Path:
    kvs = [gb.string("general.architecture", "llama"), gb.u32("llama.context_length", 512),
           gb.string("tokenizer.ggml.model", model), gb.array("tokenizer.ggml.tokens", gb.STR, [gb.s(t) for t in tokens]),
           gb.array("tokenizer.ggml.token_type", gb.I32, [struct.pack("<i", 1)] * len(tokens)),
           gb.u32("tokenizer.ggml.bos_token_id", bos), gb.u32("tokenizer.ggml.eos_token_id", eos)]
    if add_bos is not None:
        kvs.append(gb.boolean("tokenizer.ggml.add_bos_token", add_bos))
    path.write_bytes(gb.gguf(*kvs))
    return path


TOKENS = [f"tok{i}" for i in range(300)]


def test_the_vocabulary_is_read_from_the_header(tmp_path: Path) -> None:
    v = read_vocabulary(_vocab_model(tmp_path / "a.gguf", TOKENS, add_bos=True))
    assert (v.model, len(v.tokens), v.tokens[7], v.bos_id, v.eos_id, v.add_bos, v.add_eos) == \
        ("gpt2", 300, b"tok7", 1, 2, True, None)
    assert read_header(v.path).metadata["tokenizer.ggml.tokens"].length == 300  # type: ignore[union-attr]
    big = read_vocabulary(_vocab_model(tmp_path / "big.gguf", [f"t{i:06d}" * 30 for i in range(20_000)]))
    assert len(big.tokens) == 20_000 and big.tokens[-1] == b"t019999" * 30  # spans several read chunks


@pytest.mark.parametrize(("change", "why"), [
    ({"model": "llama"}, "tokenizer 'llama' vs 'gpt2'"),
    ({"tokens": TOKENS + [f"x{i}" for i in range(129)]}, "429 tokens vs 300"),
    ({"tokens": TOKENS[:150] + ["other"] + TOKENS[151:]}, "token 150 is 'other' vs 'tok150'"),
    ({"add_bos": True, "bos": 9}, "BOS token id 9 vs 1"),
    ({"add_bos": False}, "add_bos_token False vs True"),
])
def test_a_draft_with_another_vocabulary_is_a_typed_error_naming_both(
        tmp_path: Path, change: dict[str, Any], why: str) -> None:
    model = _vocab_model(tmp_path / "big-model.gguf", TOKENS, add_bos=True)
    args: dict[str, Any] = {"tokens": TOKENS, "add_bos": True, **change}
    draft = _vocab_model(tmp_path / "small-draft.gguf", args.pop("tokens"), **args)
    with pytest.raises(DraftModelMismatchError) as info:
        speculative.check_draft(model, draft)
    assert why in str(info.value)
    assert "small-draft.gguf cannot draft for big-model.gguf" in str(info.value)
    assert (info.value.model, info.value.draft) == (model, draft)


def test_a_draft_with_the_same_vocabulary_passes(tmp_path: Path) -> None:
    model = _vocab_model(tmp_path / "m.gguf", TOKENS)
    speculative.check_draft(model, _vocab_model(tmp_path / "d.gguf", TOKENS + ["extra"] * 100))  # <= 128 more
    first_ids_differ = ["a", "b", "c", "d", "e", *TOKENS[5:]]  # ids below 5 are not compared (llama.cpp's rule)
    speculative.check_draft(model, _vocab_model(tmp_path / "d2.gguf", first_ids_differ))


def test_a_mismatched_draft_fails_before_any_server_is_looked_for(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """No llama-server exists in the unit tests: the error must come from the headers alone."""
    monkeypatch.setenv("GGUF_PROVIDER_LLAMA_SERVER", str(tmp_path / "missing-llama-server"))
    model = _vocab_model(tmp_path / "m.gguf", TOKENS)
    draft = _vocab_model(tmp_path / "d.gguf", TOKENS, model="llama")
    with pytest.raises(DraftModelMismatchError):
        Engine(EngineConfig(model_path=str(model), speculative=str(draft))).load()


def test_a_draft_that_names_nothing_says_what_speculative_takes(tmp_path: Path) -> None:
    from gguf_provider.errors import ModelNotFoundError
    from gguf_provider.runtime._serve.config import resolve_spec

    model = _vocab_model(tmp_path / "m.gguf", TOKENS)
    with pytest.raises(ModelNotFoundError, match=r"speculative='ngarm' names no draft model.*'auto', 'off'"):
        resolve_spec(EngineConfig(model_path=str(model), speculative="ngarm"))


def test_embedding_servers_never_speculate(tmp_path: Path) -> None:
    from gguf_provider.runtime._serve.config import resolve_spec

    model = _vocab_model(tmp_path / "m.gguf", TOKENS)
    assert resolve_spec(EngineConfig(model_path=str(model), embedding=True)).speculative == "off"
    assert resolve_spec(EngineConfig(model_path=str(model))).speculative == "auto"
    spec = resolve_spec(EngineConfig(model_path=str(model), speculative=str(model), kv_cache_type="q8_0"))
    assert (spec.speculative, spec.draft_model, spec.kv_cache_type) == ("draft", model, "q8_0")


# --- memory by cache type ----------------------------------------------------------------------------------------


def test_cache_types_cost_their_ggml_block_size() -> None:
    assert fit.cache_type_bytes("f16") == 2 and fit.cache_type_bytes("f32") == 4
    assert fit.cache_type_bytes("q8_0") == 34 / 32 and fit.cache_type_bytes("q4_0") == 18 / 32
    assert fit.cache_type_bytes("q5_1") == 24 / 32 and fit.cache_type_bytes("iq4_nl") == 18 / 32
    assert fit.is_quantized("q8_0") and not fit.is_quantized("bf16")


def test_a_quantized_cache_fits_a_larger_automatic_context(tmp_path: Path) -> None:
    standin = gb.STANDINS["qwen"]  # native 32768
    header = read_header(standin.write(tmp_path))
    kv_f16 = fit.kv_cache_bytes(header, 8192)
    memory = fit.MemoryInfo(ram_available=int((standin.size + kv_f16 + 512 * fit.MiB) / 0.9) + 1)
    f16 = fit.fit_context(header, standin.size, memory=memory)
    per = fit.cache_type_bytes("q8_0")
    q8 = fit.fit_context(header, standin.size, memory=memory, type_k_bytes=per, type_v_bytes=per)
    assert f16.n_ctx == 8192 and q8.n_ctx >= 1.85 * f16.n_ctx  # 2 / (34/32) = 1.88, in steps of 256


def test_the_budget_charges_the_cache_type_and_the_draft(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    header = read_header(gb.STANDINS["smollm2"].write(tmp_path))
    size = gb.STANDINS["smollm2"].size
    kv = fit.kv_cache_bytes(header, 4096)
    compute, own = budget.plan.host_compute_bytes(header, 4096), budget.SERVER_OVERHEAD
    assert budget.charge(header, size, 4096) == size + kv + compute + own
    assert budget.charge(header, size, 4096, cache_type="q8_0") == size + kv * 34 // 64 + compute + own
    assert budget.charge(header, 2 * size, 4096, draft=header) == 2 * size + 2 * (kv + compute) + own
    # Under a fixed limit the automatic context follows the type.
    monkeypatch.setenv(budget.LIMIT_ENV, str(budget.charge(header, size, 2560)))
    monkeypatch.delenv(budget.MAX_MODELS_ENV, raising=False)
    monkeypatch.setattr(budget, "holders", lambda data: [])
    monkeypatch.setattr(budget.registry, "read", dict)
    plenty = fit.MemoryInfo(ram_available=64 * fit.GiB)

    def admitted(**kw: Any) -> int:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the shrink warning
            return budget.admit(header, size, requested=None, n_gpu_layers=None, memory=lambda: plenty, **kw).n_ctx

    f16, q8, q4 = admitted(), admitted(cache_type="q8_0"), admitted(cache_type="q4_0")
    assert f16 == 2560 and 1.6 * f16 <= q8 < q4 <= 8192  # the compute buffer grows with the context too


# --- drafted and accepted tokens in the adapters' metadata --------------------------------------------------------


def _speculative_replay() -> Any:
    """The recorded SmolLM2 chat with the timings a speculating server adds (`draft_n`, `draft_n_accepted`)."""
    replay = load_replay("smollm2_chat")
    for ex in replay.exchanges:
        if ex["path"] == "/v1/chat/completions":
            lines = []
            for line in ex["body"].split("\n"):
                if line.startswith("data: {") and '"timings"' in line:
                    chunk = json.loads(line[6:])
                    chunk["timings"].update(draft_n=10, draft_n_accepted=8)
                    line = "data: " + json.dumps(chunk)
                lines.append(line)
            ex["body"] = "\n".join(lines)
    return replay


@pytest.mark.parametrize("stream", [False, True])
def test_drafted_and_accepted_tokens_reach_langchain_metadata(stream: bool) -> None:
    llm = ChatGGUF(base_url=BASE_URL, transport=_speculative_replay().transport)
    if stream:
        msg: Any = None
        for chunk in llm.stream("Say hi"):
            msg = chunk if msg is None else msg + chunk
    else:
        msg = llm.invoke("Say hi")
    assert isinstance(msg, AIMessage)
    timings = msg.response_metadata["timings"]
    assert (timings["draft_n"], timings["draft_n_accepted"]) == (10, 8)


@pytest.mark.parametrize("stream", [False, True])
def test_drafted_and_accepted_tokens_reach_llama_index_raw(stream: bool) -> None:
    llm = GGUF(base_url=BASE_URL, transport=_speculative_replay().transport)
    messages = [ChatMessage(role="user", content="Say hi")]
    reply = list(llm.stream_chat(messages))[-1] if stream else llm.chat(messages)
    assert (reply.raw["timings"]["draft_n"], reply.raw["timings"]["draft_n_accepted"]) == (10, 8)
