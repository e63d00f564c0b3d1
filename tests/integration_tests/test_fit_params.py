"""Our planner against llama.cpp's own fit (`llama fit-params`, built beside llama-server) on a real device:
a local RPC worker (RPC0), its room set with `--fit-target` (what llama.cpp keeps free) and the same room given to
our plan. docs/gpu.md ("Against llama.cpp's fit") explains the one difference measured here.

llama.cpp's fit sizes its trial context with logits for a whole micro-batch (512 outputs: 96 MiB for SmolLM2's
49,152-token vocabulary) where llama-server, once started, reserves them for its slots (4 outputs, 260 when it
speculates). Planned for 512 outputs, ours agrees with it within a few layers and never places more; planned for
the server it starts, ours places more layers than fit-params would, and what it places is what llama-server then
allocates (test_gpu_split.py, test_memory_real.py).
"""

from __future__ import annotations

import subprocess

import pytest

from gguf_provider.runtime._common import gguf
from gguf_provider.runtime._memory import devices, plan
from gguf_provider.runtime._memory.devices import Device
from tests.integration_tests.test_rpc import Worker
from tests.support.runtime import RuntimeEnv
from tests.support.tools import tool_path

MiB = 1 << 20
pytestmark = pytest.mark.timeout(300)


def _fit_params(binary: str, model: str, n_ctx: int, endpoint: str, target_mib: int) -> int:
    """The -ngl llama.cpp's fit chooses (-1, "all", as the layer count plus the output head)."""
    out = subprocess.run([binary, "fit-params", "-m", model, "-c", str(n_ctx), "--rpc", endpoint, "-fitt",
                          str(target_mib)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("-c ")]
    words = line.split()
    ngl = int(words[words.index("-ngl") + 1])
    return ngl


def test_the_plan_agrees_with_llama_cpp_s_fit(rt: RuntimeEnv, worker: Worker) -> None:
    beside = rt.binary.parent / "llama"
    llama = beside if beside.is_file() else tool_path("llama")
    assert llama is not None, "the unified `llama` binary is built beside llama-server (`gguf-provider server install`)"
    (rpc0,) = [d for d in devices.list_devices(rt.binary, rpc=[worker.endpoint]) if d.kind == "rpc"]
    header = gguf.read_header(rt.model)
    full = (header.block_count or 0) + 1
    free = rpc0.free // MiB
    seen = []
    for room in (300, 205, 180, 155, 105):  # MiB llama.cpp may fill: from all layers to none
        theirs = _fit_params(str(llama), str(rt.model), 1024, worker.endpoint, free - room)
        theirs = full if theirs < 0 else theirs
        named = [Device("RPC0", "rpc", worker.endpoint, (room * MiB) + plan.FIT_TARGET, room * MiB + plan.FIT_TARGET),
                 devices.host_device()]
        like_fit = plan.for_model(header, [rt.model], named, n_ctx=1024, n_outputs=512).n_gpu_layers
        as_served = plan.for_model(header, [rt.model], named, n_ctx=1024).n_gpu_layers
        seen.append((room, theirs, like_fit, as_served))
        assert like_fit <= theirs <= like_fit + 5, seen  # ours errs high by a few MiB of compute: a few layers
        assert as_served >= like_fit, seen
    assert seen[0][1] == full and seen[-1][1] <= 1  # the range spans all layers to none
    assert any(s > t for _, t, _, s in seen), seen  # the server's own outputs leave room for more layers
