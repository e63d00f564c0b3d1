"""Options declared once (gguf_provider/options.py): every adapter takes every engine option it applies to, a
misspelled option warns by name and is forwarded, a known option reaches the engine and the request body.

The adapters run end to end against recorded llama-server answers (tests/unit_tests/replays, made by
scripts/capture_replays.py from our build): no binary, no model.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from llama_index.core.base.llms.types import ChatMessage

from gguf_provider import ChatGGUF, GGUFEmbeddings
from gguf_provider.engine import EngineConfig
from gguf_provider.llama_index import GGUF, GGUFEmbedding
from gguf_provider.options import UnknownOptionWarning, forward_unknown
from tests.support.replay import BASE_URL, Replay, load_replay

CHAT = [ChatGGUF, GGUF]
EMBEDDINGS = [GGUFEmbeddings, GGUFEmbedding]
ALL = CHAT + EMBEDDINGS
EXTRA = {ChatGGUF: "model_kwargs", GGUFEmbeddings: "model_kwargs", GGUF: "additional_kwargs",
         GGUFEmbedding: "additional_kwargs"}

# EngineConfig fields no user sets: the adapter kind decides `embedding` and `rerank`; `progress` is for the front
# ends (magics, CLI) that draw it.
INTERNAL = {"embedding", "rerank", "progress"}
CHAT_ONLY = {"chat_template", "chat_template_file", "reasoning_format", "vision", "mmproj", "speculative",
             "media_allow_hosts", "prompt_cache", "cache_reuse"}
EMBEDDING_ONLY = {"pooling"}


def _engine_options() -> set[str]:
    return {f.name for f in dataclasses.fields(EngineConfig)} - INTERNAL


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_engine_option_is_settable(cls: type[Any]) -> None:
    skip = EMBEDDING_ONLY if cls in CHAT else CHAT_ONLY
    missing = _engine_options() - skip - set(cls.model_fields)
    assert not missing, f"{cls.__name__} lacks {sorted(missing)}"


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_option_has_a_description(cls: type[Any]) -> None:
    ours = {name for klass in cls.__mro__ if klass.__module__.startswith("gguf_provider")
            for name in getattr(klass, "__annotations__", {}) if not name.startswith("_")}
    ours &= set(cls.model_fields)
    assert len(ours) > 20
    undocumented = sorted(n for n in ours if not (cls.model_fields[n].description or "").strip())
    assert not undocumented, f"{cls.__name__}: no description for {undocumented}"


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_misspelled_option_warns_by_name_and_is_forwarded(cls: type[Any]) -> None:
    typo = "temprature" if cls in CHAT else "poolng"
    meant = "temperature" if cls in CHAT else "pooling"
    with pytest.warns(UnknownOptionWarning, match=rf"'{typo}' \(did you mean '{meant}'\?\)"):
        obj = cls(model="m", **{typo: 0})
    assert getattr(obj, EXTRA[cls]) == {typo: 0}


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_a_far_unknown_option_warns_without_a_guess(cls: type[Any]) -> None:
    with pytest.warns(UnknownOptionWarning, match=r"no option 'dry_multiplier': it is sent") as record:
        obj = cls(model="m", dry_multiplier=0.8)
    assert "did you mean" not in str(record[0].message)
    assert getattr(obj, EXTRA[cls]) == {"dry_multiplier": 0.8}


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_known_options_warn_nothing(cls: type[Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cls(model="m", port=8080, offline=True, start_timeout=5, n_parallel=2, token="t", timeout=None)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_known_option_inside_the_extras_dict_is_an_error(cls: type[Any]) -> None:
    with pytest.raises(ValueError, match="n_ctx as their own parameters"):
        cls(model="m", **{EXTRA[cls]: {"n_ctx": 4096}})


def test_forward_unknown_leaves_non_dicts_alone() -> None:
    assert forward_unknown(ChatGGUF, "not a dict", "model_kwargs") == "not a dict"


# --- end to end over recorded answers ---------------------------------------------------------------------------


@pytest.fixture
def chat_replay() -> Replay:
    return load_replay("smollm2_chat")


@pytest.fixture
def embeddings_replay() -> Replay:
    return load_replay("smollm2_embeddings")


def _chat(cls: type[Any], replay: Replay, **options: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnknownOptionWarning)
        return cls(base_url=BASE_URL, transport=replay.transport, **options)


def test_chatgguf_options_reach_the_request(chat_replay: Replay) -> None:
    llm = _chat(ChatGGUF, chat_replay, temperature=0.3, top_k=7, stop=["\n\n"], temprature=1)
    reply = llm.invoke("Say hi")
    assert isinstance(reply, AIMessage) and reply.content
    body = chat_replay.bodies("/v1/chat/completions")[-1]
    assert (body["temperature"], body["top_k"], body["stop"], body["temprature"]) == (0.3, 7, ["\n\n"], 1)
    assert body["stream"] is True and body["max_tokens"] > 0  # the default: what the context leaves


def test_gguf_options_reach_the_request(chat_replay: Replay) -> None:
    llm = _chat(GGUF, chat_replay, temperature=0.3, min_p=0.05, temprature=1)
    reply = llm.chat([ChatMessage(role="user", content="Say hi")])
    assert reply.message.content
    body = chat_replay.bodies("/v1/chat/completions")[-1]
    assert (body["temperature"], body["min_p"], body["temprature"]) == (0.3, 0.05, 1)


def test_per_call_arguments_override_the_fields(chat_replay: Replay) -> None:
    llm = _chat(ChatGGUF, chat_replay, temperature=0.3, max_tokens=9)
    llm.invoke("Say hi", temperature=0.9, mirostat=2)
    body = chat_replay.bodies("/v1/chat/completions")[-1]
    assert (body["temperature"], body["max_tokens"], body["mirostat"]) == (0.9, 9, 2)


@pytest.mark.parametrize("cls", EMBEDDINGS, ids=lambda c: c.__name__)
def test_embedding_extras_reach_the_request(cls: type[Any], embeddings_replay: Replay) -> None:
    emb = _chat(cls, embeddings_replay, encoding_format="float")
    vectors = emb.embed_documents(["hello", "world"]) if cls is GGUFEmbeddings \
        else emb.get_text_embedding_batch(["hello", "world"])
    assert len(vectors) == 2 and len(vectors[0]) == 576  # SmolLM2's width
    body = embeddings_replay.bodies("/v1/embeddings")[-1]
    assert body == {"encoding_format": "float", "input": ["hello", "world"]}


def test_reference_doc_is_generated_from_the_descriptions() -> None:
    from scripts import gen_reference

    assert gen_reference.TARGET.read_text() == gen_reference.render(), \
        "docs/reference.md is out of date: run python scripts/gen_reference.py"
