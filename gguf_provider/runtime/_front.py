"""The runtime's front door, :class:`Runtime`: what the engine, the CLI and the magics ask of the runtime, in one
small class over the private folders (``_common``, ``_models``, ``_install``, ``_memory``, ``_serve``).

Each method imports the folder it needs when it is called: making a Runtime costs nothing, and a process that only
attaches to a running server never loads the installer or the planner.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._common.cancel import Cancel, in_thread
from ._common.progress import Progress
from ._serve.health import DEFAULT_START_TIMEOUT

if TYPE_CHECKING:
    import os

    import httpx

    from ._install.backend import InUse
    from ._install.discovery import ServerCapabilities
    from ._install.installed import Installation
    from ._memory.choose import Choice
    from ._memory.devices import Device
    from ._memory.plan import Plan
    from ._models import LocalModel, ModelRef, Resolution, ResolvedModel
    from ._serve.config import ServerConfig
    from ._serve.manager import Lease, ServerInfo, ServerManager
    from ._serve.server_options import ServerSpec
    from ._serve.status import Status


@dataclass(frozen=True)
class Stopped:
    """A server :meth:`Runtime.stop` stopped, or the stale entry it removed (``running`` False: its process was
    gone, or is one we cannot prove we started)."""

    pid: int
    model: str
    running: bool


@dataclass(frozen=True)
class Devices:
    """What a server can place layers on, and the llama-server that listed them (None: none found yet; the GPUs
    then come from nvidia-smi)."""

    devices: list[Device]
    seen_by: Path | None
    workers: tuple[str, ...] = ()  # the RPC workers asked (host:port)


@dataclass(frozen=True)
class ModelPlan:
    """A memory plan for a model, and where it was made (the devices named, or this machine)."""

    plan: Plan
    where: str
    speculative_extra: int  # bytes of logits speculative decoding adds on the output device
    choice: Choice | None = None  # several quants and none named: each planned, and the one auto picks


class Runtime:
    """One front door to the runtime (thread-safe). Servers: :meth:`acquire` / :meth:`aacquire` (a lease on a
    healthy server), :meth:`attach`, :meth:`spec`, :meth:`status`, :meth:`stop`, :meth:`gateway`. Models: :meth:`resolve`,
    :meth:`pull`, :meth:`models`, :meth:`describe`, :meth:`identify`, :meth:`confine`. llama-server: :meth:`find_binary`, :meth:`binary`, :meth:`install`,
    :meth:`server_info`, :meth:`capabilities`, :meth:`backend`. Memory: :meth:`devices`, :meth:`plan`.
    ``manager`` (tests: one with fake collaborators) defaults to the process's."""

    def __init__(self, manager: ServerManager | None = None) -> None:
        self._manager = manager

    @property
    def manager(self) -> ServerManager:
        """The manager given, else the process's (asked each time: a test may replace it)."""
        if self._manager is not None:
            return self._manager
        from ._serve.manager import get_manager

        return get_manager()

    # -- servers --------------------------------------------------------------------------------------------------

    def acquire(self, spec: ServerSpec, *, shared: bool = True, keep_alive: float | None = None,
                start_timeout: float = DEFAULT_START_TIMEOUT, progress: Progress | None = None,
                cancel: Cancel | None = None) -> Lease:
        """A lease on a healthy server for ``spec``: a running one shared, or one started (installing llama-server
        first if there is none). ``cancel`` stops a start at its next checkpoint (LoadCancelled)."""
        return self.manager.acquire(spec, shared=shared, keep_alive=keep_alive, start_timeout=start_timeout,
                                    progress=progress, cancel=cancel)

    async def aacquire(self, spec: ServerSpec, *, shared: bool = True, keep_alive: float | None = None,
                       start_timeout: float = DEFAULT_START_TIMEOUT, progress: Progress | None = None) -> Lease:
        """:meth:`acquire` in a worker thread: the event loop never waits. Cancelling the awaiting task stops the
        start at its next checkpoint (a server it was starting is stopped and unregistered); a lease it got just
        as its caller left is abandoned (the server stops unless another client holds it)."""
        def acquire(cancel: Cancel) -> Lease:
            return self.acquire(spec, shared=shared, keep_alive=keep_alive, start_timeout=start_timeout,
                                progress=progress, cancel=cancel)

        return await in_thread(acquire, abandon=lambda lease: lease.abandon())

    def attach(self, base_url: str, api_key: str | None = None, *, timeout: float = 10.0,
               transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None) -> ServerInfo:
        """A running llama-server (http URL or Unix socket path), started by anyone: nothing is spawned."""
        from ._serve.manager import attach

        return attach(base_url, api_key, timeout, transport=transport)

    def status(self, *, live: bool = False) -> Status:
        """The servers we run (after a sweep of dead ones) and the memory budget; ``live``: each server's numbers
        from /metrics and /slots, within a bound however the servers behave."""
        from ._serve.status import status

        return status(live=live)

    def home(self) -> Path:
        """The directory gguf-provider keeps its state in (``$GGUF_PROVIDER_HOME`` or the user cache dir)."""
        from ._common import paths

        return paths.home()

    @contextmanager
    def gateway(self, url: str, *, key_file: str = "", n_ctx: int | None = None) -> Iterator[None]:
        """While the body runs, this process is a gateway at ``url``: ``status`` (``gguf-provider ps``) says which
        servers it holds; ``key_file`` (the file its clients' key is in, "" for none) and ``n_ctx`` (its --ctx)
        are recorded for the clients that look it up (``gguf-provider launch``)."""
        from ._serve.status import register_gateway, unregister_gateway

        path = register_gateway(url, key_file=key_file, n_ctx=n_ctx)
        try:
            yield
        finally:
            unregister_gateway(path)

    def stop(self, which: str | None = None) -> list[Stopped]:
        """Stop our servers whose id starts with ``which`` (None: all of them), or remove their stale entries."""
        from ._serve import registry

        gone = []
        with registry.locked() as data:
            for key in list(data):
                if which is None or key.startswith(which):
                    gone.append(data.pop(key))
        out = []
        for e in gone:
            running = registry.server_alive(e)
            registry.stop_entry(e)
            out.append(Stopped(e.pid, e.model, running))
        return out

    # -- models ---------------------------------------------------------------------------------------------------

    def resolve(self, ref: ModelRef | str) -> Resolution:
        """The model's files (and projector, draft): found on disk or downloaded. Several quants and none named:
        the one that fits this machine best (:mod:`._memory.choose`)."""
        from ._models import ModelRef, resolve

        return resolve(_choosing(ModelRef(ref) if isinstance(ref, str) else ref))

    def spec(self, config: ServerConfig, *, progress: Progress | None = None) -> ServerSpec:
        """What a server of ``config`` is: its model resolved (found, or downloaded: ``progress`` gets the reports),
        with its projector and draft, and the options as ``config`` has them."""
        from ._serve.config import resolve_spec

        return resolve_spec(config, progress=progress)

    def pull(self, ref: ModelRef | str, *, force: bool = False) -> ResolvedModel:
        """Download a Hugging Face model into the cache (the Hub is always asked); several quants and none named:
        the one that fits this machine best."""
        from ._models import ModelRef, pull

        return pull(_choosing(ModelRef(ref) if isinstance(ref, str) else ref), force=force)

    def confine(self, name: str) -> None:
        """ModelNotFoundError unless ``name`` is a model a shared endpoint may serve: a models-dir name, a Hugging
        Face repo, or a path inside the models dirs or the Hugging Face cache (no other path is looked at)."""
        from ._models import confine

        confine(name)

    def describe(self, ref: ModelRef | str) -> dict[str, Any]:
        """What a model is, from its file's header (nothing is started): its path, size, quant, architecture,
        context length, pooling (embedders), chat template, and the header's scalar metadata."""
        from ._common import gguf

        model = self.resolve(ref).model
        header = gguf.read_header(model.path)
        scalars = {k: v for k, v in header.metadata.items() if isinstance(v, (str, int, float, bool))
                   and not k.startswith("tokenizer.")}
        return {"path": str(model.path), "size": model.size_bytes, "quant": model.quant,
                "architecture": header.architecture, "name": header.name, "context_length": header.context_length,
                "pooling": header.pooling_type not in (None, 0), "chat_template": header.chat_template,
                "modified": model.path.stat().st_mtime, "metadata": scalars}

    def identify(self, files: Sequence[str | os.PathLike[str]], *, wait: float = 0.0,
                 digest: bool = True) -> list[dict[str, Any] | None]:
        """Who each model file is, for clients that group and show models (Ollama's tags, show and ps), None for a
        path that is no file: ``digest`` (``sha256:<hex>``, the same for every name of one file; "" when not asked),
        ``architecture``, ``parameter_count``, ``parameter_size`` (``"494.03M"``), ``quant`` (the header's type,
        else the name's), ``context_length``, ``pooling``, ``chat_template``, ``projector`` (a fitting mmproj
        beside it, or None), ``metadata`` (the header's scalars, short arrays, ``general.parameter_count``). A
        digest not known yet is hashed in the background, waited for ``wait`` seconds in all; the rule then is
        :mod:`._models.identity`'s. Reads files: call it off the event loop."""
        from ._memory.choose import quant_type
        from ._models import identity
        from ._models.files import parse_quant

        given = [Path(f) for f in files]
        sums = identity.digests().many(given, wait=wait) if digest else [""] * len(given)
        out: list[dict[str, Any] | None] = []
        for path, sha in zip(given, sums, strict=True):
            try:
                facts = identity.facts(path)
            except OSError:
                out.append(None)
                continue
            if sha is None:
                out.append(None)
                continue
            header = facts.header
            mmproj = None if header is None or facts.embedder else identity.projector(path, header.embedding_length)
            out.append({"path": str(path), "digest": sha, "architecture": header.architecture if header else "",
                        "name": header.name if header else None, "parameter_count": facts.parameter_count,
                        "parameter_size": identity.parameter_size(facts.parameter_count) if facts.parameter_count
                        else "", "quant": (quant_type(header) if header else None) or parse_quant(path.name),
                        "context_length": header.context_length if header else None,
                        "pooling": header.pooling_type if header else None,
                        "chat_template": header.chat_template if header else None,
                        "projector": str(mmproj) if mmproj else None, "metadata": dict(facts.metadata)})
        return out

    def models(self) -> list[LocalModel]:
        """The GGUF models on this machine: the models dirs, then the Hugging Face cache."""
        from ._models import list_local_models

        return list_local_models()

    # -- llama-server ---------------------------------------------------------------------------------------------

    def find_binary(self, explicit: str | None = None) -> Path:
        """The llama-server discovery finds; BinaryNotFoundError (saying how to install one) when there is none."""
        from ._install.discovery import find_llama_server

        return find_llama_server(explicit)

    def capabilities(self, binary: Path) -> ServerCapabilities:
        """What ``binary`` can do: its version and optional flags, probed from ``--help`` (cached per binary)."""
        from ._install.discovery import probe

        return probe(binary)

    def backend(self, binary: Path) -> InUse:
        """Which backend ``binary`` computes with on this machine and why (``line``, ``why``; ``warning`` when a
        GPU it could use sits idle)."""
        from ._install.backend import in_use

        return in_use(binary)

    def binary(self, explicit: str | None = None) -> Path:
        """The llama-server to run (``explicit``, else discovery), installed first when there is none."""
        from ._install.install import ensure_installed

        return ensure_installed(explicit)

    def install(self, backend: str = "auto", *, method: str = "auto", force: bool = False,
                cmake_args: list[str] | None = None, progress: Progress | None = None,
                remember: bool = True, tag: str | None = None) -> Installation:
        """Install llama-server for ``backend`` (the release archive, else the source build) of llama.cpp release
        ``tag`` (``bNNNN``, ``latest``; None or ``pin``: the pinned one). ``remember``: a named backend and tag are
        the ones used from now on (none named: the machine's backend, the pinned release); installs of other tags
        stay beside it."""
        from ._install import install, installed, prebuilt

        resolved = prebuilt.resolve_tag(tag)
        inst = install.install(backend, method=method, force=force, cmake_args=cmake_args, progress=progress,
                               tag=resolved)
        if remember:
            installed.name_backend(inst.backend if backend != "auto" else None)
            installed.name_tag(None if resolved == prebuilt.PINNED_TAG else resolved)
        return inst

    def update(self, backend: str = "auto", *, progress: Progress | None = None, tries: int = 5) -> Installation:
        """The newest llama.cpp release whose archive installs and passes the smoke run (newest first, ``tries``
        of them), named as the one in use; PrebuiltInstallError saying why each failed when none does."""
        from ..errors import PrebuiltInstallError
        from ._install import installed, prebuilt

        failed: list[str] = []
        for tag in prebuilt.newest_tags(count=tries):
            try:
                inst = self.install(backend, method="prebuilt", progress=progress, remember=False, tag=tag)
            except PrebuiltInstallError as exc:
                failed.append(f"{tag}: {exc}")
                continue
            installed.name_tag(None if tag == prebuilt.PINNED_TAG else tag)
            return inst
        raise PrebuiltInstallError("no recent llama.cpp release installs here: " + "; ".join(failed), "no-asset")

    def installs(self) -> list[tuple[Installation, bool]]:
        """Every llama-server gguf-provider installed, newest first, and whether it is the one in use."""
        from ._install import installed

        in_use = installed.any_installed()
        return [(i, in_use is not None and i.bin_dir == in_use.bin_dir) for i in installed.installations()]

    def server_info(self) -> dict[str, Any] | None:
        """What ``gguf-provider server info`` says of the llama-server in use (None: none found): its path, how
        it was found, version, origin, the tools beside it, its optional flags and its backend."""
        import datetime

        from ._install import backend, discovery, installed

        found = discovery.locate()
        if found is None:
            return None
        path, how = found
        caps = discovery.probe(path)
        ours = next((i for i in installed.installations() if i.server.resolve() == path.resolve()), None)
        tools = {name: " ".join(cmd) for name, cmd in discovery.tools(path).items()}
        verdict = backend.in_use(path)
        built = datetime.datetime.fromtimestamp(path.resolve().stat().st_mtime).date().isoformat()
        from ._serve import features

        return {"path": str(path), "found_by": how, "command": discovery.command(path), "version": caps.version,
                "built": built, "lacks": {f: features.OPTIMISATIONS[f] for f in features.missing_optimisations(caps)},
                "origin": ours.describe() if ours else "not installed by gguf-provider",
                "install": ours.marker if ours else None, "tools": tools, "flags": caps.flags,
                "backend": {"build": verdict.build, "chosen": verdict.choice.backend, "why": verdict.why,
                            "host": backend.current_host().to_json()}}

    # -- memory ---------------------------------------------------------------------------------------------------

    def devices(self, rpc: Sequence[str] | str = ()) -> Devices:
        """What a server could place layers on now: the GPU-like devices of the llama-server in use (and of the
        ``rpc`` workers), then RAM. ValueError: a malformed worker or ``$GGUF_PROVIDER_DEVICE_LIMIT``."""
        from ._install import discovery
        from ._memory import devices
        from ._memory import rpc as rpc_mod

        workers = rpc_mod.normalize(rpc)
        found = discovery.locate()
        return Devices(devices.machine_devices(found[0] if found else None, rpc=workers),
                       found[0] if found else None, workers)

    def plan(self, model: ModelRef | str, *, devices: Sequence[str] = (), rpc: Sequence[str] | str = (),
             n_ctx: int | None = None, n_gpu_layers: int | None = None, kv_cache_type: str = "f16",
             speculative: bool = False) -> ModelPlan:
        """Where ``model``'s layers would go, without starting anything: on the ``devices`` named
        (``KIND:MEMORY``), else on this machine's (with ``rpc`` workers). A repo, directory or name with several
        quants and none named: every quant planned (``choice``), nothing downloaded. ValueError: a malformed
        device."""
        import contextlib
        from dataclasses import replace

        from ..errors import InsufficientMemoryError
        from ._common import gguf
        from ._memory import choose
        from ._memory import devices as devices_mod
        from ._memory import plan as plan_mod
        from ._memory import rpc as rpc_mod
        from ._models import ModelRef
        from ._models.files import QuantFile

        named = devices_mod.number_devices([devices_mod.parse_device_arg(d) for d in devices])
        rpc_mod.normalize(rpc)
        devices_mod.device_limits()  # a malformed $GGUF_PROVIDER_DEVICE_LIMIT is said before anything runs
        if named:
            listed = named if any(d.kind == "cpu" for d in named) else [*named, devices_mod.host_device()]
            where = "the devices named"
        else:
            seen = self.devices(rpc)
            listed = seen.devices
            where = (f"this machine as {seen.seen_by} sees it" if seen.seen_by else
                     "this machine (no llama-server yet: nvidia-smi)")
        outputs = plan_mod.SPECULATIVE_OUTPUTS if speculative else 4
        ref = ModelRef(model) if isinstance(model, str) else model
        choices: list[choose.Choice] = []
        inner = choose.chooser(n_ctx=n_ctx, cache_type=kv_cache_type, n_outputs=outputs, devices=listed,
                               seen=choices, quiet=True)

        def compare(name: str, files: Sequence[QuantFile]) -> tuple[int, str]:
            with contextlib.suppress(InsufficientMemoryError):
                inner(name, files)
            raise _Compared  # every quant planned: nothing to download

        try:
            resolved = self.resolve(replace(ref, choose=compare)).model
        except _Compared:
            made = choices[0]
            shown = made.choice or made.verdicts[0]
            header = shown.option.header
            extra = plan_mod.logits_bytes(header, plan_mod.SPECULATIVE_OUTPUTS) - plan_mod.logits_bytes(header)
            return ModelPlan(shown.plan, where, extra, made)
        header = gguf.read_header(resolved.path)
        gguf.require_model(header, resolved.path)
        placed = plan_mod.for_model(header, list(resolved.shards), listed, n_ctx=n_ctx, n_gpu_layers=n_gpu_layers,
                                    cache_type=kv_cache_type, model=resolved.path.name, n_outputs=outputs)
        extra = plan_mod.logits_bytes(header, plan_mod.SPECULATIVE_OUTPUTS) - plan_mod.logits_bytes(header)
        return ModelPlan(placed, where, extra)


def _choosing(ref: ModelRef) -> ModelRef:
    """``ref`` with the automatic quant choice for this machine, unless it has a chooser."""
    from dataclasses import replace

    from ._memory.choose import chooser

    return ref if ref.choose is not None else replace(ref, choose=chooser())


class _Compared(Exception):
    """Raised by :meth:`Runtime.plan`'s chooser once every quant is planned: the resolve stops before a download."""


_default = Runtime()  # stateless over the process's manager (asked at each call)


def default() -> Runtime:
    """The process's Runtime (over the process's server manager)."""
    return _default


__all__ = ["Devices", "ModelPlan", "Runtime", "Stopped", "default"]
