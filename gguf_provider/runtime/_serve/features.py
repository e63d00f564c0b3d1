"""What a llama-server build can do, from its own ``--help`` (:func:`.._install.discovery.probe`), not from our pin.

Every flag a start writes is looked up. A build without one of :data:`CORE` is refused (it is no llama-server we can
run); an optimisation it lacks (:data:`OPTIMISATIONS`) is left out, said in one line per binary; an option the user
set that needs a flag the build lacks (:data:`.server_options.ServerOption.needs`) is a ValueError naming the flag
and what to install. Endpoints that only some builds have degrade by themselves: ``/metrics`` (``ps`` shows "–"),
``/slots`` (no prompt cache restore), ``/apply-template`` (no pre-count); ``/v1/rerank`` needs ``--rerank``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from ..._warn import warn
from ...errors import BuildFeatureWarning
from .._install.discovery import ServerCapabilities
from . import speculative as speculative_mod
from .server_options import OPTIONS, ServerOption, ServerSpec

log = logging.getLogger(__name__)

# Without these nothing starts: the model, the context, the address, the alias that marks the process as ours.
CORE = ("--model", "--ctx-size", "--host", "--port", "--alias")
# Left out, with one line, when the build lacks them: what each gives.
OPTIMISATIONS = {
    "--metrics": "live numbers in `ps`",
    "--cache-reuse": "cache reuse after trimmed messages",
    "--slot-save-path": "the prompt cache across restarts",
    "--kv-unified": "one KV cache shared by the parallel slots",
    "--fit": "our memory plan instead of the build's own fitting",
    "--jinja": "the model's own chat template (tool calls, reasoning)",
    "--no-webui": "no web UI",
    "--offline": "no network access by the server",
}
HOW_TO_GET = ("`gguf-provider server install` installs the build gguf-provider is tested with, or "
              "`gguf-provider server install --tag latest` a newer one (docs/install.md)")


_said: set[str] = set()


def check(spec: ServerSpec, caps: ServerCapabilities) -> None:
    """ValueError when the build cannot run ``spec``: a core flag missing, or an option the user set that needs a
    flag it lacks."""
    absent = [f for f in CORE if f in caps.flags and not caps.supports(f)]
    if absent:
        raise ValueError(f"{caps.path} (version {caps.version}) lists no {', '.join(absent)} in its --help: it is "
                         f"no llama-server gguf-provider can run; {HOW_TO_GET}")
    for o in OPTIONS:
        if o.needs and _asked(o, spec) and not any(caps.supports(f) for f in o.needs):
            value = getattr(spec, o.name)
            raise ValueError(f"{o.name}={value!r} needs a llama-server with {' or '.join(o.needs)}; {caps.path} "
                             f"(version {caps.version}) has none. {HOW_TO_GET}")
    why = speculative_mod.unsupported(spec.speculative, caps)
    if why and spec.speculative not in (speculative_mod.AUTO, speculative_mod.OFF):  # "auto": a warning, once
        raise ValueError(f"speculative={spec.speculative!r} needs a newer llama-server: {caps.path} (version "
                         f"{caps.version}) {why}. {HOW_TO_GET}")


def _asked(o: ServerOption, spec: ServerSpec) -> bool:
    """Whether the user set ``o`` (an optimisation at its default is ours, not theirs)."""
    if o.name == "speculative":  # its own rule below: off needs nothing, auto is ours
        return False
    value = getattr(spec, o.name, None)
    return value not in (None, False, (), "") and value != o.default


def missing_optimisations(caps: ServerCapabilities) -> list[str]:
    """The optimisations of :data:`OPTIMISATIONS` the build lacks."""
    return [f for f in OPTIMISATIONS if f in caps.flags and not caps.supports(f)]


def say_dropped(caps: ServerCapabilities, binary: Path | str) -> None:
    """One :class:`BuildFeatureWarning` per binary: what is left out because the build lacks it."""
    dropped = missing_optimisations(caps)
    if not dropped or str(binary) in _said:
        return
    _said.add(str(binary))
    what = "; ".join(f"{f} ({OPTIMISATIONS[f]})" for f in dropped)
    log.info("llama-server %s lacks %s", binary, ", ".join(dropped))
    warn(f"this llama-server ({binary}, version {caps.version}) has no {what}: left out. {HOW_TO_GET}",
         BuildFeatureWarning)


def request_needs(payload: dict[str, object], flags: dict[str, bool], model: str) -> None:
    """ValueError when a request asks for what the server's build lacks (``flags``: its probed flags; empty for a
    server we did not start, which is not second-guessed)."""
    if flags and "reasoning_budget_tokens" in payload and not flags.get("--reasoning-budget", True):
        raise ValueError(f"reasoning_budget needs a llama-server with --reasoning-budget; the one serving "
                         f"{Path(model).name} has none. {HOW_TO_GET}")


__all__: Sequence[str] = ("CORE", "OPTIMISATIONS", "check", "missing_optimisations", "request_needs",
                          "say_dropped")
