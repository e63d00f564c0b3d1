"""Every llama-server option, declared once: :data:`OPTIONS`.

One :class:`ServerOption` says what an option is called, its type and default, what it means (the adapters'
descriptions and docs/reference.md), the llama-server flags it becomes (:mod:`.argv` walks the table), whether it
is part of the server's identity (another value: another server; :meth:`ServerSpec.identity`), which build flags it
needs (the capability probe, :class:`~.discovery.ServerCapabilities`), and how a value is checked, by one function
each: when a config is made (``normalize``: the engine's config and the adapters' fields alike) and against the
build and the model before a start (``check``).

Derived from the table: the command line (:func:`.argv.build_argv`), the identity and family hashes, the
validation of :class:`~gguf_provider.engine.EngineConfig` and of the adapters' pydantic fields
(:mod:`gguf_provider.options`), the spec an engine config becomes (:func:`spec_values`), the ``options`` that
``gguf-provider ps`` shows (:func:`summary`) and the reference page (scripts/gen_reference.py).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ...errors import NotARerankerError
from .._common import threads as threads_mod
from .._common.gguf import read_tensors
from .._common.spec_fields import SpecOptions
from .._memory import fit as fit_mod
from .._memory import rpc as rpc_mod
from . import speculative as speculative_mod

if TYPE_CHECKING:
    from .._common.gguf import GGUFHeader
    from .._install.discovery import ServerCapabilities

EMBED_UBATCH_MAX = 8192
# llama.cpp's pooling types by number (`{arch}.pooling_type` in a GGUF header) and `--pooling` name.
POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


class Place(enum.IntEnum):
    """Where an option's flags go on the command line (in the table's order within one place)."""

    HEAD = 0  # written by the start itself: the binary, -c (the admitted context), --host/--port (the address)
    MAIN = 1
    CACHE = 2  # the KV cache type (and the flash attention a quantized one needs)
    SPECULATION = 3  # after the cache: a draft's own cache takes the cache's type
    LAST = 4  # the user's server_args: last, so that they win


@dataclass(frozen=True)
class Build:
    """What one start's command line depends on besides the spec."""

    caps: ServerCapabilities
    n_ctx: int  # the admitted context (the fit's, or the asked one)
    header_pooling: int | None = None  # the model header's pooling type
    placement: tuple[str, ...] = ()  # the memory plan's -ngl / --tensor-split / --n-cpu-moe (runtime/_memory/plan.py)
    slot_save_path: Path | None = None  # the prompt cache's directory for this server (runtime/_serve/prompt_cache.py)
    recurrent: bool = False  # the model has recurrent (SSM) layers (its header's `ssm.*` keys)
    threads: int | None = None  # -t/-tb of a server computing on the CPU (runtime/_common/threads.py); None: none written


Identity = Literal["args", "file", "binary"] | None
Group = Literal["server", "chat", "embedding"] | None


@dataclass(frozen=True)
class ServerOption:
    """One llama-server option (see the module docstring for what is derived from it)."""

    name: str
    type: Any  # the adapters' annotation (EngineConfig holds a list as a tuple)
    default: Any
    description: str
    flags: tuple[str, ...] = ()  # the llama-server flags it becomes
    # Its flags for a spec and a build; None: ``flags[0] value`` when the value is set (``flags[0]`` alone for a
    # bool), nothing when it is None, False or empty.
    argv: Callable[[ServerSpec, Build], list[str]] | None = None
    place: Place = Place.MAIN
    # "args": the value is one of the identity's args (another value, another server); "file": the identity of the
    # file it resolves to; "binary": the binary's identity; None: no part of it.
    identity: Identity = "args"
    family: bool = True  # False: servers that differ only here are one family (a larger n_ctx serves a smaller)
    # The build's flags it needs, one of them (`ServerCapabilities.supports`; each is one the probe reads).
    needs: tuple[str, ...] = ()
    normalize: Callable[[Any], Any] | None = None  # at construction: the stored value, or ValueError
    # Before a start, against the build and the headers of the model (and of its draft); ValueError.
    check: Callable[[ServerSpec, ServerCapabilities, Sequence[GGUFHeader]], None] | None = None
    group: Group = "server"  # the adapters that have it: every one, chat models, embedding models; None: none
    resolved: bool = False  # the spec holds what the engine resolves it to (a file, a draft), not the value
    factory: Callable[[], Any] | None = None  # the pydantic default factory (a mutable default such as [])

    def flags_for(self, spec: ServerSpec, build: Build) -> list[str]:
        if self.argv is not None:
            return self.argv(spec, build)
        if self.place == Place.HEAD:
            return []
        value = getattr(spec, self.name)
        if value is None or value is False or value == () or value == "":
            return []
        return [self.flags[0]] if value is True else [self.flags[0], str(value)]


# --- the rules of the options whose flags are more than `flag value` ---------------------------------------------


def embedding_pooling(asked: str | None, header_pooling: int | None) -> str | None:
    """The `--pooling` to pass, or None to let the model's own pooling type (from its header) stand.

    What the user asked wins. A model whose header names a pooling type (an embedder: BERT mean, BGE cls,
    Qwen3-Embedding last) keeps it: forcing `mean` on a CLS- or last-token-pooled model silently degrades its
    vectors. A model with none (a chat model) or `none` gets `mean`: the OpenAI-style endpoint needs a pooled vector.
    """
    if asked:
        return asked
    if header_pooling in POOLING_NAMES and header_pooling != 0:
        return None
    return "mean"


def user_ubatch(server_args: Sequence[str]) -> int | None:
    """The physical batch (``-ub``/``--ubatch-size``) the user set in ``server_args``, if any. Without one, an
    embedding server gets ``min(n_ctx, EMBED_UBATCH_MAX)``."""
    return threads_mod.int_flag(server_args, "-ub", "--ubatch-size")


def user_cache_ram(server_args: Sequence[str]) -> int | None:
    """The host-RAM prompt cache (``--cache-ram``/``-cram``, MiB; -1 no limit, 0 off) the user set, if any."""
    return threads_mod.int_flag(server_args, "--cache-ram", "-cram")


def cache_type_args(cache_type: str, caps: ServerCapabilities) -> list[str]:
    """``--cache-type-k/-v`` for a type other than the server's default f16; a quantized V cache needs flash
    attention, so it is turned on (``-fa on``, or the bare flag of older builds)."""
    if cache_type == fit_mod.DEFAULT_CACHE_TYPE:
        return []
    argv = ["--cache-type-k", cache_type, "--cache-type-v", cache_type]
    if fit_mod.is_quantized(cache_type) and caps.supports("--flash-attn"):
        argv += ["--flash-attn", "on"] if "on" in caps.allowed("--flash-attn") else ["--flash-attn"]
    return argv


def validate_cache_type(cache_type: Any) -> str:
    """``kv_cache_type`` checked against the types the fit can size (ValueError naming the closest)."""
    if not isinstance(cache_type, str):
        raise ValueError(f"kv_cache_type must be a string such as 'q8_0', not {type(cache_type).__name__}")
    value = cache_type.strip().lower()
    if value not in fit_mod.CACHE_TYPES:
        close = difflib.get_close_matches(value, list(fit_mod.CACHE_TYPES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"kv_cache_type={cache_type!r} is not a KV cache type{hint}; use one of "
                         f"{', '.join(fit_mod.CACHE_TYPES)}")
    return value


def check_cache_type(cache_type: str, caps: ServerCapabilities, header: GGUFHeader) -> None:
    """Before a start: a cache type this build does not list, or whose blocks do not divide the model's head
    sizes (llama.cpp refuses both), is a ValueError that says what to pick instead."""
    if cache_type == fit_mod.DEFAULT_CACHE_TYPE:
        return
    listed = caps.allowed("--cache-type-k")
    if not caps.supports("--cache-type-k") or (listed and cache_type not in listed):
        have = f"it lists {', '.join(listed)}" if listed else "it has no --cache-type-k"
        raise ValueError(f"kv_cache_type={cache_type!r} is not a KV cache type of this llama-server ({have}; "
                         f"{caps.path})")
    block = fit_mod.CACHE_TYPES[cache_type][0]
    dims = {d for d in (header.head_dim, header.value_head_dim) if d}
    if block > 1 and any(d % block for d in dims):
        raise ValueError(f"kv_cache_type={cache_type!r} stores blocks of {block} values, which do not divide "
                         f"{header.path.name}'s attention head size ({', '.join(map(str, sorted(dims)))}); use "
                         f"f16, bf16 or f32 for this model")


def _n_gpu_layers(spec: ServerSpec, build: Build) -> list[str]:
    if spec.n_gpu_layers is not None:
        return ["-ngl", str(spec.n_gpu_layers)]
    if build.placement:  # the plan's layers per device, placed as planned
        return [*build.placement, *_fit_off(spec, build)]
    return ["-ngl", "999"] if spec.rpc_servers else []  # every layer on the devices (the workers), however many


def _fit_off(spec: ServerSpec, build: Build) -> list[str]:
    """llama.cpp's own fit (`--fit on`, its default) would re-place what the plan placed, after a trial load that
    took 9 s on an H200: off, unless the user's own arguments say otherwise."""
    return ["--fit", "off"] if build.caps.supports("--fit") and "--fit" not in spec.server_args else []


def _n_parallel(spec: ServerSpec, build: Build) -> list[str]:
    if spec.n_parallel is None:
        return []
    return ["-np", str(spec.n_parallel), *(["--kv-unified"] if build.caps.supports("--kv-unified") else [])]


def _embedding(spec: ServerSpec, build: Build) -> list[str]:
    """``--embedding``, its pooling and one physical batch; nothing more, as measured (bench/NOTES.md, P15: MiniLM,
    one CPU thread, embedding and reranking servers alike). Flash attention is on already: the build's default
    ``auto`` turns it on where the device has the kernel (``-fa off`` ran at 0.43x; ``-fa on`` would skip that
    check; an older build's bare ``-fa`` gained nothing). One slot (``-np 1``) instead of the automatic four: 1.00-1.02x.
    The host-RAM prompt cache holds nothing of theirs: llama-server caches completion prompts only, and an idle
    slot's copy is its token list (0 MiB of state)."""
    if not spec.embedding or spec.rerank:  # a reranker's `--rerank` is `--embedding --pooling rank` (_rerank)
        return []
    argv = ["--embedding"]
    pooling = embedding_pooling(spec.pooling, build.header_pooling)
    if pooling:
        argv += ["--pooling", pooling]
    return argv + _one_batch(spec, build)


def _one_batch(spec: ServerSpec, build: Build) -> list[str]:
    """A pooled input (an embedded text, a reranked query+document pair) must fit one physical batch: with the
    default (512) longer inputs fail with "input is too large to process"."""
    if user_ubatch(spec.server_args) is not None:
        return []
    n = str(min(build.n_ctx, EMBED_UBATCH_MAX))
    return ["--batch-size", n, "--ubatch-size", n]


def _rerank(spec: ServerSpec, build: Build) -> list[str]:
    # no more flags than an embedding server, as measured (_embedding)
    return ["--rerank", *_one_batch(spec, build)] if spec.rerank else []


# The tensors of a classifier head (llama.cpp's LLM_TENSOR_CLS / LLM_TENSOR_CLS_OUT): a cross-encoder's score.
CLASSIFIER_TENSORS = ("cls.output.weight", "cls.weight")


def is_reranker(header: GGUFHeader, files: Sequence[Path]) -> bool:
    """Whether a model scores query/document pairs: its header's pooling type is `rank` (Qwen3-Reranker), or it
    has a classifier head (BERT/XLM-RoBERTa cross-encoders such as bge-reranker, whose header names no pooling)."""
    if header.pooling_type == 4:
        return True
    return any(t.name in CLASSIFIER_TENSORS for f in files for t in read_tensors(f))


def _check_rerank(spec: ServerSpec, caps: ServerCapabilities, headers: Sequence[GGUFHeader]) -> None:
    if not spec.rerank or not headers or is_reranker(headers[0], spec.shards or (spec.model,)):
        return
    header = headers[0]
    pooling = ("names no pooling type" if header.pooling_type is None else
               f"names pooling type {POOLING_NAMES.get(header.pooling_type, header.pooling_type)}, not rank")
    raise NotARerankerError(
        f"{spec.model.name} is not a reranker: its GGUF header {pooling} and it has no classifier head "
        f"({' or '.join(CLASSIFIER_TENSORS)} tensor), so llama-server's /v1/rerank would score with whatever its "
        f"first output is. Use a reranker GGUF such as bge-reranker-v2-m3 (docs/reranking.md)", spec.model)


def _prompt_cache(spec: ServerSpec, build: Build) -> list[str]:
    # The start decides (runtime/prompt_cache.why_off, the size limit): a directory in the build means on.
    return ["--slot-save-path", str(build.slot_save_path)] if spec.prompt_cache and build.slot_save_path else []


DEFAULT_CACHE_REUSE = 64  # tokens; measured in bench/NOTES.md (P18)


def _whole(name: str, low: int, high: int | None, otherwise: str) -> Callable[[Any], int | None]:
    """A normalizer: a whole number in ``[low, high]``, or None (``otherwise`` says what None does)."""
    def check(value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            bound = f"{low} to {high}" if high is not None else f"{low} or more"
            raise ValueError(f"{name}={value!r}: pass a whole number, {bound}, or None for {otherwise}")
        return value
    return check


def validate_threads(value: Any) -> int | None:
    """``threads``: a positive count, or None for the runtime's split of the cores (runtime/_common/threads.py)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"threads={value!r}: pass a number of CPU threads (1 or more), or None for gguf-provider's "
                         "split of the cores among the servers that share them (docs/runtime.md)")
    return value


def _threads(spec: ServerSpec, build: Build) -> list[str]:
    return threads_mod.argv(build.threads)  # the start decides (the user's value, or the split)


def validate_cache_reuse(value: Any) -> int:
    """``cache_reuse``: a chunk size in tokens, 0 (or False) for off."""
    if value is False:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"cache_reuse={value!r}: pass a chunk size in tokens (e.g. {DEFAULT_CACHE_REUSE}), or 0 "
                         "for off")
    return value


def _cache_reuse(spec: ServerSpec, build: Build) -> list[str]:
    # Left off where llama-server cannot shift the cache: embedding and reranking servers keep no history, a
    # projector turns it off with a warning, and a recurrent model's state cannot lose a middle part (this build
    # aborts when a shift asks it to: common_context_seq_rm).
    if (not spec.cache_reuse or spec.embedding or spec.rerank or spec.mmproj is not None or build.recurrent
            or not build.caps.supports("--cache-reuse")):
        return []
    return ["--cache-reuse", str(spec.cache_reuse)]


def _written_by_embedding(spec: ServerSpec, build: Build) -> list[str]:
    return []  # `--pooling` goes with `--embedding` (_embedding): a chat server pools nothing


def _rpc_servers(spec: ServerSpec, build: Build) -> list[str]:
    return ["--rpc", ",".join(spec.rpc_servers)] if spec.rpc_servers else []


def _server_args(spec: ServerSpec, build: Build) -> list[str]:
    return list(spec.server_args)


def _kv_cache_type(spec: ServerSpec, build: Build) -> list[str]:
    return cache_type_args(spec.kv_cache_type, build.caps)


def _check_kv_cache_type(spec: ServerSpec, caps: ServerCapabilities, headers: Sequence[GGUFHeader]) -> None:
    for header in headers:
        check_cache_type(spec.kv_cache_type, caps, header)


def _speculative(spec: ServerSpec, build: Build) -> list[str]:
    return speculative_mod.server_args(spec.speculative, spec.draft_model, build.caps, spec.kv_cache_type)


def _check_speculative(spec: ServerSpec, caps: ServerCapabilities, headers: Sequence[GGUFHeader]) -> None:
    speculative_mod.check_type(spec.speculative, caps)


# --- the table ----------------------------------------------------------------------------------------------------
# The identity's args are the "args" options in this order: a new one is appended at the end of those (every
# server's key changes with the release that adds it). The command line follows the order within each place.

OPTIONS: tuple[ServerOption, ...] = (
    ServerOption(
        "n_ctx", int | None, None,
        "Context window in tokens; default: the model's own, fitted to free memory.",
        flags=("-c",), place=Place.HEAD, family=False,
        normalize=_whole("n_ctx", 1, None, "the model's own context, fitted to free memory")),
    ServerOption(
        "mmproj", str | None, None,
        "A multimodal projector file (`.gguf`, architecture `clip`) to load with the model; implies `vision` "
        "(docs/vision.md).",
        flags=("--mmproj",), identity="file", needs=("--mmproj",), group="chat", resolved=True),
    ServerOption(
        "vision", bool, False,
        "Load the model's `mmproj` projector (beside the file or in the repo) so image blocks reach the model.",
        flags=("--mmproj",), argv=lambda spec, build: [], identity="file", needs=("--mmproj",), group="chat",
        resolved=True),  # it becomes the spec's mmproj (the projector found), which writes the flag
    ServerOption(
        "n_gpu_layers", int | None, None,
        "Layers to offload to the GPUs (`-ngl`, the output head counting as one); default: the memory plan's, as "
        "many as fit, the rest in RAM (`gguf-provider plan`, docs/gpu.md).",
        flags=("-ngl", "--tensor-split", "--n-cpu-moe", "--device", "--fit"), argv=_n_gpu_layers,
        normalize=_whole("n_gpu_layers", -1, None, "as many as fit")),
    ServerOption(
        "n_parallel", int | None, None,
        "Parallel slots (`-np`); default: llama-server's automatic choice, sharing one KV cache.",
        flags=("-np", "--kv-unified"), argv=_n_parallel,
        normalize=_whole("n_parallel", 1, None, "llama-server's automatic choice")),
    ServerOption(
        "embedding", bool, False,
        "An embedding server (`--embedding`): the embedding adapters set it, it is no parameter of theirs.",
        flags=("--embedding", "--batch-size", "--ubatch-size"), argv=_embedding, needs=("--embedding",), group=None),
    ServerOption(
        "pooling", Literal["mean", "cls", "last", "rank"] | None, None,
        "How token vectors become one vector (llama-server's `--pooling`); default: the pooling type in the "
        "model's GGUF header (an embedder's own), `mean` for a model that names none (a chat model).",
        flags=("--pooling",), argv=_written_by_embedding, needs=("--pooling",), group="embedding"),
    ServerOption(
        "chat_template", str | None, None,
        "A built-in llama.cpp template name (e.g. `chatml`) instead of the model's own.",
        flags=("--chat-template",), group="chat"),
    ServerOption(
        "chat_template_file", str | None, None, "A Jinja chat template file to use instead.",
        flags=("--chat-template-file",), needs=("--chat-template-file",), group="chat"),
    ServerOption(
        "reasoning_format", str | None, None,
        "llama-server's `--reasoning-format` (e.g. `deepseek`, `none`); default: the server's.",
        flags=("--reasoning-format",), needs=("--reasoning-format",), group="chat"),
    ServerOption(
        "rpc_servers", list[str], (),
        "llama.cpp RPC workers (`host:port`, `gguf-provider rpc-worker`) to spread the model over (`--rpc`): "
        "each worker is a device to the memory plan, which puts as many layers on them as their memory holds "
        "(all, unless `n_gpu_layers` says otherwise) and the rest in RAM (docs/distributed.md, docs/gpu.md).",
        flags=("--rpc",), argv=_rpc_servers, needs=("--rpc",), normalize=rpc_mod.normalize, factory=list),
    ServerOption(
        "server_args", list[str], (),
        "Extra llama-server command-line arguments, passed as they are.",
        argv=_server_args, place=Place.LAST, factory=list),
    ServerOption(
        "port", int | None, None,
        "Listen on 127.0.0.1 (with a random key file) instead of a private Unix socket: on this port if it is "
        "free, else on any free one (0: any).",
        flags=("--host", "--port", "--api-key-file"), place=Place.HEAD,
        normalize=_whole("port", 0, 65535, "a private Unix socket")),
    ServerOption(
        "speculative", bool | str, "auto",
        "Speculative decoding: `auto` = the build's n-gram self-speculation (no extra model; fast on replies that "
        "repeat the prompt, e.g. code edits), False/`off`, an n-gram type (`ngram-mod`, `ngram-simple`, ...), or "
        "a draft model (path, name or `org/repo:QUANT`) with the model's vocabulary (docs/speed.md).",
        flags=("--spec-default", "--spec-type", "--spec-draft-model"), argv=_speculative, place=Place.SPECULATION,
        needs=("--spec-default", "--spec-type", "--spec-draft-model", "--model-draft"),
        normalize=speculative_mod.normalize,
        check=_check_speculative, group="chat", resolved=True),
    ServerOption(
        "kv_cache_type", str, fit_mod.DEFAULT_CACHE_TYPE,
        "KV cache type for K and V (`--cache-type-k/-v`): `f16`, `q8_0` (about half the memory), `q4_0`, ... as "
        "the build lists; the automatic context is fitted at its size, and a quantized type turns flash attention "
        "on (docs/speed.md).",
        flags=("--cache-type-k", "--cache-type-v", "--flash-attn"), argv=_kv_cache_type, place=Place.CACHE,
        needs=("--cache-type-k",), normalize=validate_cache_type, check=_check_kv_cache_type),
    ServerOption(
        "rerank", bool, False,
        "A reranking server (`--rerank`: `/v1/rerank`, pooling `rank`) for a reranker model, checked to be one "
        "before the start: the reranking adapters set it, it is no parameter of theirs (docs/reranking.md).",
        flags=("--rerank", "--batch-size", "--ubatch-size"), argv=_rerank, needs=("--rerank",), check=_check_rerank,
        group=None),
    ServerOption(
        # No part of the identity (servers with it on and off are shared, the first start's setting holds): the
        # directory is the identity's own, and a server without it only misses the cache.
        "prompt_cache", bool, True,
        "Save the KV of long prompts (at least 256 tokens) when the server stops (keep_alive, eviction, "
        "`gguf-provider stop`) and restore it when the next server of the same model and options gets a request "
        "starting with one (`--slot-save-path`); the disk it uses is bounded by `$GGUF_PROVIDER_PROMPT_CACHE_SIZE` "
        "(docs/runtime.md). Off for servers with a draft model or a projector.",
        flags=("--slot-save-path",), argv=_prompt_cache, identity=None, needs=("--slot-save-path",), group="chat"),
    ServerOption(
        # Part of the identity, like speculation: a reused chunk keeps the KV computed after the messages that were
        # dropped, so replies can differ from a server without it.
        "cache_reuse", int, DEFAULT_CACHE_REUSE,
        "Reuse cached runs of at least this many tokens after older messages were dropped (`--cache-reuse`; 0: off; "
        "docs/speed.md).",
        flags=("--cache-reuse",), argv=_cache_reuse, needs=("--cache-reuse",), normalize=validate_cache_reuse,
        group="chat"),
    ServerOption(
        # No part of the identity, like the prompt cache: a server with another count gives the same replies; the
        # first start's setting holds.
        "threads", int | None, None,
        "CPU threads for generation and batches (`-t`/`-tb`); default: the physical cores divided among the "
        "CPU servers gguf-provider runs at once (the first gets them all; docs/runtime.md). Not written for a "
        "model offloaded whole to GPUs.",
        flags=("-t", "-tb"), argv=_threads, identity=None, normalize=validate_threads),
    ServerOption(
        "llama_server", str | None, None,
        "The llama-server binary to run; default: discovery (`$GGUF_PROVIDER_LLAMA_SERVER`, PATH, our build).",
        place=Place.HEAD, identity="binary"),
)
BY_NAME: Mapping[str, ServerOption] = {o.name: o for o in OPTIONS}
ARGS: tuple[ServerOption, ...] = tuple(o for o in OPTIONS if o.identity == "args")  # the identity's args
IN_ARGV_ORDER: tuple[ServerOption, ...] = tuple(sorted(OPTIONS, key=lambda o: o.place))  # stable: table order


def spec_values(config: SpecOptions) -> dict[str, Any]:
    """The options a :class:`ServerSpec` takes from ``config`` (an EngineConfig) as they are; the ``resolved``
    ones (projector, speculation) are the engine's to resolve."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(SpecOptions)}


def summary(spec: ServerSpec) -> dict[str, Any]:
    """The options of ``spec`` that differ from the defaults, as JSON values (the ``options`` of ``ps``)."""
    out: dict[str, Any] = {}
    for o in OPTIONS:
        if not hasattr(spec, o.name):
            continue  # vision: it resolved to the spec's mmproj
        value = getattr(spec, o.name)
        default = getattr(ServerSpec, o.name, o.default)
        if value != default:
            out[o.name] = list(value) if isinstance(value, tuple) else str(value) if isinstance(value, Path) else value
    return out


def _file_id(p: Path) -> list[Any]:
    st = p.stat()
    return [str(p.resolve()), st.st_size, st.st_mtime_ns]


def _json(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True)
class ServerSpec(SpecOptions):
    """Everything that makes two servers interchangeable: the model's files and the declared options (a field
    per :data:`OPTIONS` entry, as the engine resolved it: the entries that are not ``resolved`` are
    :class:`SpecOptions`' fields, written from the table)."""

    model: Path
    shards: tuple[Path, ...] = ()
    mmproj: Path | None = None
    # Speculative decoding (runtime/_serve/speculative.py): "off", "auto", an n-gram type, or "draft" with draft_model.
    # "off" here, unlike the adapters' "auto": a bare spec (bench's raw server) speculates only when asked.
    speculative: str = speculative_mod.OFF
    draft_model: Path | None = None
    draft_shards: tuple[Path, ...] = ()

    def identity(self, binary: Path) -> dict[str, Any]:
        return {
            "binary": _file_id(binary),
            "model": [_file_id(p) for p in (self.shards or (self.model,))],
            "mmproj": _file_id(self.mmproj) if self.mmproj else None,
            "draft": [_file_id(p) for p in (self.draft_shards or (self.draft_model,))] if self.draft_model else None,
            "args": [_json(getattr(self, o.name)) for o in ARGS],
        }

    def family(self, binary: Path) -> str:
        """The identity without the options that are no part of the family (the context: a server with a context
        at least the asked one serves the request)."""
        ident = self.identity(binary)
        ident["args"] = [value for o, value in zip(ARGS, ident["args"], strict=True) if o.family]
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]

    def check(self, caps: ServerCapabilities, headers: Sequence[GGUFHeader]) -> None:
        """Before a start: each option's check against this build and the headers of the model (and of its
        draft), in command-line order (ValueError; a model that cannot serve the option: NotARerankerError)."""
        for o in IN_ARGV_ORDER:
            if o.check is not None:
                o.check(self, caps, headers)
