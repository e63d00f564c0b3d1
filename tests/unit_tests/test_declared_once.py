"""An option is declared once (issue 46.3): a llama-server option in ``runtime/_serve/server_options.OPTIONS``, a
model option in ``runtime/_common/model_source.ModelSource``; ``scripts/gen_options.py`` writes the adapters'
pydantic fields and the runtime's dataclass fields (``SpecOptions``, ``ResolvedOptions``) from them.
``EngineConfig`` is a ``ServerConfig`` (those classes) plus the engine's own fields, ``ServerSpec`` a
``SpecOptions``, ``ModelRef`` a ``ModelSource``: no field is written twice by hand. Every option an adapter takes
for its engine reaches the config, and from it the spec or the model reference: a field that cannot reach the
server fails here (set to a value other than its default on every adapter, it must arrive), never a silent drop.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr

from gguf_provider import ChatGGUF, GGUFEmbeddings, GGUFRerank, options
from gguf_provider.engine import EngineConfig
from gguf_provider.llama_index import GGUF, GGUFEmbedding, GGUFRerankPostprocessor
from gguf_provider.runtime._common.model_source import ModelSource
from gguf_provider.runtime._common.spec_fields import ResolvedOptions, SpecOptions
from gguf_provider.runtime._models import ModelRef
from gguf_provider.runtime._serve import server_options
from gguf_provider.runtime._serve.config import ServerConfig, resolve_spec
from gguf_provider.runtime._serve.server_options import ServerSpec
from scripts import gen_options
from tests.support import gguf_bytes as gb

ADAPTERS: list[type[BaseModel]] = [ChatGGUF, GGUF, GGUFEmbeddings, GGUFEmbedding, GGUFRerank, GGUFRerankPostprocessor]
# The engine's own fields: what an engine is beside the model and the server options.
ENGINE_OWN = {"base_url", "api_key", "keep_alive", "shared", "timeout", "start_timeout", "max_retries", "progress",
              "media_allow_hosts"}
# A value other than the default, which the option's check takes, for every option an adapter gives its engine. A
# new option fails test_every_engine_option_of_every_adapter_reaches_its_config until it has one here.
SAMPLES: dict[str, Any] = {
    "model": "org/repo", "repo": "org/other", "quant": "Q8_0", "filename": "x.Q8_0.gguf", "revision": "v1",
    "hf_token": "hf_sample", "model_path": "/models/m.gguf", "offline": True, "vision": True,
    "mmproj": "/models/mmproj.gguf", "base_url": "http://127.0.0.1:9", "api_key": "sample-key", "n_ctx": 1234,
    "n_gpu_layers": 3, "n_parallel": 2, "pooling": "cls", "chat_template": "chatml",
    "chat_template_file": "/t.jinja", "reasoning_format": "none", "rpc_servers": ["10.0.0.2:50052"],
    "server_args": ["--no-warmup"], "port": 8089, "speculative": "ngram-simple", "kv_cache_type": "q8_0",
    "prompt_cache": False, "cache_reuse": 128, "threads": 3, "llama_server": "/opt/llama-server", "shared": False,
    "keep_alive": 5.0, "start_timeout": 9.0, "timeout": 7.0, "max_retries": 0, "media_allow_hosts": ["localhost"],
}


def _own(cls: type) -> set[str]:
    """The fields ``cls`` declares itself (not inherited)."""
    return set(cls.__dict__.get("__annotations__", {}))


@pytest.mark.parametrize("target", list(gen_options.RENDERERS), ids=lambda p: p.name)
def test_the_generated_modules_are_what_gen_options_writes(target: Path) -> None:
    assert target.read_text() == gen_options.RENDERERS[target](), \
        f"{target.relative_to(gen_options.ROOT)} is out of date: run python scripts/gen_options.py"


def test_the_runtime_configs_restate_no_option() -> None:
    """EngineConfig declares only the engine's own fields; ServerSpec only what the engine resolves (the model's
    files, the speculation mode and draft); ModelRef only how to resolve. The rest comes from the bases."""
    assert _own(EngineConfig) == ENGINE_OWN and _own(ServerConfig) == set()
    bases = [{f.name for f in dataclasses.fields(b)} for b in (ModelSource, ResolvedOptions, SpecOptions)]
    assert not (bases[0] & bases[1] or bases[0] & bases[2] or bases[1] & bases[2])
    assert {f.name for f in dataclasses.fields(EngineConfig)} == set().union(*bases) | ENGINE_OWN
    assert _own(ServerSpec) == {"model", "shards", "mmproj", "speculative", "draft_model", "draft_shards"}
    assert _own(ModelRef) == {"cache_dir", "draft", "progress", "choose"}
    # Every table entry is a config field; the model options that are also server options (vision, mmproj) are
    # ModelSource's, with the table's default.
    config = {f.name: f for f in dataclasses.fields(EngineConfig)}
    for o in server_options.OPTIONS:
        want = tuple(o.default) if isinstance(o.default, list) else o.default
        assert config[o.name].default == want, o.name
    for name in gen_options.MODEL_IN_TABLE:
        assert server_options.BY_NAME[name].resolved, name


@pytest.mark.parametrize("cls", ADAPTERS, ids=lambda c: c.__name__)
def test_the_adapters_model_fields_are_model_sources(cls: type[BaseModel]) -> None:
    for f in dataclasses.fields(ModelSource):
        doc = f.metadata["doc"]
        if doc is None:
            continue  # a server option: test_typing_user checks it against the table
        field = cls.model_fields[f.name]
        assert field.description == doc and field.default == f.default, f.name
        if f.metadata.get("alias"):
            assert f.metadata["alias"] in options.aliases(field), f.name


@pytest.mark.parametrize("cls", ADAPTERS, ids=lambda c: c.__name__)
def test_every_engine_option_of_every_adapter_reaches_its_config(cls: type[BaseModel]) -> None:
    names = options.engine_fields(cls)
    missing = sorted(set(names) - set(SAMPLES))
    assert not missing, f"{cls.__name__}: no sample value for {missing}: add one to SAMPLES"
    config_fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    assert set(names) <= set(config_fields), f"{cls.__name__}: {set(names) - set(config_fields)} reach no config"
    # With nothing set, each option the adapter has defaults as the config does.
    bare = cls(model="m").engine_config()  # type: ignore[attr-defined]
    for name in names:
        if name not in ("model", "api_key"):  # the one set; the environment's key
            assert getattr(bare, name) == config_fields[name].default, (cls.__name__, name)
    # Each set to a value other than its default arrives, as the config holds it.
    made = cls(**{name: SAMPLES[name] for name in names}).engine_config()  # type: ignore[attr-defined]
    for name in names:
        want = SAMPLES[name]
        want = tuple(want) if isinstance(want, list) else want
        got = getattr(made, name)
        assert got == want and got != config_fields[name].default, (cls.__name__, name, got)
    assert made.embedding is issubclass(cls, options.EmbeddingOptions)
    assert made.rerank is issubclass(cls, options.RerankOptions)


def test_the_adapters_engine_fields_are_their_engine_groups() -> None:
    """What makes a field an engine option: its group. A chat adapter's sampling fields are per request; its
    server, model, media and client fields (but the transport, the Engine's own) are the config's."""
    chat = set(options.engine_fields(ChatGGUF))
    assert not chat & set(options.SamplingOptions.model_fields)
    assert "transport" not in chat and {"media_allow_hosts", "kv_cache_type", "hf_token", "timeout"} <= chat
    assert "pooling" in options.engine_fields(GGUFEmbeddings) and "pooling" not in chat
    assert "truncate" not in options.engine_fields(GGUFEmbeddings)
    assert isinstance(ChatGGUF(model="m", token=SecretStr("t")).hf_token, SecretStr)


def test_a_config_reaches_the_server_spec_and_the_model_reference(tmp_path: Path) -> None:
    """Every server option set on a config is in the spec the engine resolves it to (the resolved ones as what
    they resolve to), and every model option in the reference the model is resolved from."""
    model = gb.STANDINS["smollm2"].write(tmp_path)
    spec_fields = [f.name for f in dataclasses.fields(SpecOptions)]
    values = {name: SAMPLES[name] for name in spec_fields if name in SAMPLES}
    values.update(embedding=True, rerank=True)  # no adapter's parameter: the adapters' classes set them
    assert set(values) == set(spec_fields), set(spec_fields) - set(values)
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    config = EngineConfig(model_path=str(model), speculative="ngram-simple", **values)
    spec = resolve_spec(config)
    for name in spec_fields:
        assert getattr(spec, name) == getattr(config, name) != getattr(SpecOptions, name, object()), name
    assert spec.model == model and spec.speculative == "off"  # an embedding or reranking server never speculates
    chat = resolve_spec(EngineConfig(model_path=str(model), speculative="ngram-simple"))
    assert chat.speculative == "ngram-simple"

    source = {f.name: SAMPLES[f.name] for f in dataclasses.fields(ModelSource)}
    ref = ModelRef.of(EngineConfig(**source), draft="d")
    for name, value in source.items():
        assert getattr(ref, name) == value, name
    assert ref.draft == "d"
