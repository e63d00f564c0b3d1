"""The plan against what llama.cpp allocates, on this machine's CPU (issue 51, point 3; RPC devices:
test_gpu_split.py, lavapipe: tests/vulkan_tests/test_lavapipe.py), and a server's memory against its charge while
many distinct long prompts fill its host-RAM prompt cache.

Bounds, and why: weights and KV cache are exact arithmetic over the tensor table and the cache layout (1.5 MiB:
the log rounds to 0.01 MiB, tensors are padded to 32 bytes); the compute buffers are an estimate that errs high,
never low, by at most a quarter and 8 MiB (support/memory.py); the resident memory after the load stays under the
plan plus llama.cpp's repacked copies plus 64 MiB for the process itself (its code, heap and thread stacks: ~5 MiB
measured here).
"""

from __future__ import annotations

import random
from pathlib import Path

import psutil
import pytest

from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.langchain import ChatGGUF
from gguf_provider.runtime._common import gguf
from gguf_provider.runtime._memory import devices, plan
from gguf_provider.runtime._serve import budget, registry
from tests.support.memory import MiB, assert_plan_matches_log, buffers
from tests.support.runtime import RuntimeEnv

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("which", ["smollm2", "qwen"])
def test_the_plan_is_what_llama_cpp_allocates_on_the_cpu(rt: RuntimeEnv, which: str, request: pytest.FixtureRequest
                                                         ) -> None:
    model = request.getfixturevalue(f"{which}_path")
    engine = Engine(EngineConfig(model_path=str(model), server_args=("-lv", "4")))
    try:
        info = engine.load()
        header = gguf.read_header(model)
        placed = plan.for_model(header, [model], [devices.host_device()], n_ctx=engine.n_ctx)
        log = Path(info.log_path).read_text(errors="replace")
        (server,) = rt.servers()
        assert_plan_matches_log(placed, log, rss=server.memory_info().rss)
        # The budget charges at least what the plan puts in memory, and the prompt cache on top.
        (entry,) = registry.read().values()
        cache = budget.prompt_ram(header, engine.n_ctx, pool=budget.ram_pool())
        argv = server.cmdline()
        assert argv[argv.index("--cache-ram") + 1] == str(cache // MiB) and cache > 0
        assert entry.charge >= sum(p.total for p in placed.placements) + cache
    finally:
        engine.unload()


def _distinct_prompt(seed: int, words: int) -> str:
    rnd = random.Random(seed)
    vocab = ["river", "engine", "copper", "lantern", "orbit", "meadow", "signal", "harbor", "pixel", "summit",
             "canyon", "violet", "ember", "quartz", "thimble", "falcon", "mosaic", "tundra", "saffron", "glacier"]
    body = " ".join(f"{rnd.choice(vocab)}{rnd.randrange(1000)}" for _ in range(words))
    return f"Notes {seed}: {body}\nSay OK."


def test_many_distinct_long_prompts_stay_within_the_charge(rt: RuntimeEnv) -> None:
    """Each distinct prompt leaves its KV state in the host-RAM prompt cache when its slot takes the next one;
    without a bound passed and charged, llama.cpp's default lets that grow to 8 GiB per server."""
    chat = ChatGGUF(model=str(rt.model), n_ctx=4096)  # defaults but the context: a 180 MiB cache fills sooner
    try:
        chat.invoke("Say OK.", max_tokens=1)
        (server,) = rt.servers()
        (entry,) = registry.read().values()
        argv = server.cmdline()
        cache = int(argv[argv.index("--cache-ram") + 1]) * MiB
        start = server.memory_info().rss
        peak = start
        header = gguf.read_header(rt.model)
        per_prompt = 0
        for i in range(8):  # ~1,900 tokens each: together more than the cache holds
            reply = chat.invoke(_distinct_prompt(i, 450), max_tokens=1)
            per_prompt = max(per_prompt, reply.usage_metadata["input_tokens"] if reply.usage_metadata else 0)
            peak = max(peak, psutil.Process(server.pid).memory_info().rss)
            assert peak <= entry.charge, (i, peak / MiB, entry.charge / MiB)
        state = per_prompt * budget.fit.kv_cache_bytes(header, 1)
        print(f"peak {peak / MiB:.1f} MiB of a {entry.charge / MiB:.1f} MiB charge; {start / MiB:.1f} after the "
              f"first prompt; {per_prompt} tokens a prompt ({state / MiB:.1f} MiB of KV); cache {cache / MiB:.0f} MiB")
        assert 8 * state > cache, (per_prompt, state / MiB, cache / MiB)  # more than the cache may keep
        assert peak - start > min(cache, 6 * state) // 2, (peak / MiB, start / MiB)  # and the cache did fill
    finally:
        chat.engine.unload()


def test_buffers_parse_llama_cpp_s_log_lines() -> None:
    log = ("0.01.472.379 I load_tensors:   CPU_Mapped model buffer size =   462.96 MiB\n"
           "0.01.472.390 I load_tensors:   CPU_REPACK model buffer size =    28.05 MiB\n"
           "0.01.527.737 I llama_context:        CPU  output buffer size =     2.32 MiB\n"
           "0.01.528.308 I llama_kv_cache:        CPU KV buffer size =   384.00 MiB\n"
           "0.01.997.192 I sched_reserve:        CPU compute buffer size =   153.33 MiB\n")
    got = buffers(log)
    assert got["CPU"] == {"model": 462.96 * MiB, "repack": 28.05 * MiB, "output": 2.32 * MiB, "kv": 384 * MiB,
                          "compute": 153.33 * MiB}
