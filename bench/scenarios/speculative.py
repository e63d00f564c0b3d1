"""P7/P8: speculative decoding: a code edit (P7) and chat (P8), decode tok/s with speculation "auto" ÷ off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import machine
from bench.clients import SEED
from bench.config import GOALS, N_CTX, ROOT, Config
from bench.log import log
from bench.rounds import late
from bench.stats import summary, undecided
from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.events import TextDelta, Timings

EDIT_SOURCE = ROOT / "bench" / "data" / "code_edit_module.py.txt"  # a 6 kB module, frozen (a copy of loops.py)
EDIT_TASK = ("Rename the method `_check` to `_scan` everywhere in this Python module (its definition and every call). "
             "Change nothing else. Reply with the whole module only, in one ```python block.\n\n```python\n{source}```")
CHAT_TASK = "Explain in a few paragraphs how {topic} works and why it matters."
# A new topic each round: n-gram speculation keeps a pool of what the server has seen, so a repeated chat request
# is drafted from its own earlier reply and gets faster round after round (0.8-0.9x in round 1, 1.6x by round 8):
# that measured the pool's memory, not what a new chat meets.
CHAT_TOPICS = ("a lighthouse", "a refrigerator", "a bicycle gearbox", "a sourdough starter", "a hydroelectric dam",
               "a mechanical watch", "a beehive", "a sailboat tacking upwind", "a vaccine", "a compass",
               "a heat pump", "a suspension bridge", "a library catalogue", "a steam locomotive", "a camera lens",
               "a tide", "a thermostat", "a piano", "a windmill", "a coral reef", "a postal system", "a volcano",
               "a submarine's ballast tanks", "a fountain pen", "a weather forecast", "an elevator", "a loom",
               "a printing press", "a canal lock", "an immune response", "a barometer", "a solar panel",
               "a jet engine", "a sewing machine", "a rainbow", "a credit card payment", "a smoke detector",
               "a glacier", "a microwave oven", "a traffic light", "a hot-air balloon", "a seed bank", "a telescope",
               "an espresso machine", "a lock and key", "a river delta", "a water tower", "a hearing aid",
               "a crossword puzzle", "an air traffic control tower", "a fire extinguisher", "a greenhouse",
               "a zipper", "a metronome", "a seismograph", "a parachute", "a fishing net", "a snowflake",
               "a toll road", "a cello", "a wind turbine")
EDIT_TOKENS, CHAT_TOKENS = 400, 200


def max_rounds(cfg: Config) -> tuple[int, int]:
    """P7's and P8's caps on rounds. One topic per round, never a repeat (a repeated topic met drafts from the pool
    of its first reply, most of them rejected: 0.82x in each of the four rounds after the 21st in a loaded run with
    21 topics). P8's rounds differ by whether the n-gram pool finds something to draft (about a third do, at
    1.1-1.9x), so its band narrows slowly: once P7 is decided, rounds are chat only (a quarter of a full round's
    time), as P1/P2's are."""
    return cfg.max_rounds, min(cfg.pair_max_rounds, len(CHAT_TOPICS))


def spec_request(engine: Engine, content: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """One greedy request: its text and the server's timings (decode tok/s, drafted/accepted tokens)."""
    text, timings = [], {}
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0,
            "seed": SEED}
    for ev in engine.stream(body, loop_guard=False):
        if isinstance(ev, TextDelta):
            text.append(ev.text)
        elif isinstance(ev, Timings):
            timings = ev.data
    return "".join(text), timings


def batch_ceiling(cold: dict[str, Any]) -> dict[str, float]:
    """What any speculation can gain on this machine: the server's batch (prompt) tok/s ÷ its one-token decode
    tok/s, both from the cold code-edit request without speculation. Verifying n drafted tokens is one batch, so a
    speed-up above this ratio is out of reach whatever drafts the tokens."""
    prompt, decode = float(cold.get("prompt_per_second") or 0.0), float(cold.get("predicted_per_second") or 0.0)
    return {"prompt_tok_s": prompt, "decode_tok_s": decode, "ratio": prompt / decode if decode else 0.0}


def bench_speculative(cfg: Config, model: Path) -> dict[str, Any]:
    """The same requests on two servers of one model: the default speculation ("auto") and none. Prompt cached
    (each request is sent once before it is timed); the greedy text must be the same on both."""
    p7_max_rounds, p8_max_rounds = max_rounds(cfg)
    edit = EDIT_TASK.format(source=EDIT_SOURCE.read_text())
    # One thread each, on the server core, as in P1-P5: with two threads on a 2-core machine, other work on either
    # core stalls llama.cpp's threads at their barriers (a test suite alongside took the decode to 0.4 tok/s).
    engines = {mode: Engine(EngineConfig(model_path=str(model), n_ctx=N_CTX, n_parallel=1, keep_alive=0,
                                         speculative=mode, shared=False, server_args=cfg.server_args))
               for mode in ("auto", False)}
    out: dict[str, Any] = {"model": model.name, "edit_tokens": EDIT_TOKENS, "chat_tokens": CHAT_TOKENS,
                           "server_args": " ".join(cfg.server_args)}
    try:
        for e in engines.values():
            out["pinning"] = machine.pin(e.load().pid)
        texts: dict[tuple[str, Any], str] = {}
        cold: dict[Any, dict[str, Any]] = {}
        for mode, e in engines.items():  # warm-up: the edit prompt is cached from here on
            texts[("edit", mode)], cold[mode] = spec_request(e, edit, EDIT_TOKENS)
        edit_speed: dict[Any, list[float]] = {"auto": [], False: []}
        chat_speed: dict[Any, list[float]] = {"auto": [], False: []}
        drafts: list[dict[str, Any]] = []
        chat_drafts: list[dict[str, Any]] = []
        identical = {"edit": True, "chat": True}

        def step(r: int, with_edit: bool) -> None:
            modes: list[str | bool] = ["auto", False] if r % 2 == 0 else [False, "auto"]
            chat = CHAT_TASK.format(topic=CHAT_TOPICS[r])
            tasks = (("edit", edit, EDIT_TOKENS, edit_speed), ("chat", chat, CHAT_TOKENS, chat_speed))
            for task, content, n, dest in tasks if with_edit else tasks[1:]:
                for mode in modes:
                    text, t = spec_request(engines[mode], content, n)
                    if task == "edit":
                        identical[task] &= text == texts[(task, mode)] == texts[(task, "auto" if not mode else False)]
                    else:
                        texts[(task, mode)] = text
                    dest[mode].append(float(t.get("predicted_per_second") or 0.0))
                    if mode == "auto":
                        keep = {k: t.get(k) for k in ("draft_n", "draft_n_accepted", "predicted_n")}
                        (drafts if task == "edit" else chat_drafts).append(keep)
            identical["chat"] &= texts[("chat", "auto")] == texts[("chat", False)]
            edit_text = (f"code edit {edit_speed['auto'][-1]:.1f} vs {edit_speed[False][-1]:.1f} tok/s; "
                         if with_edit else "")
            log(f"P7/P8 round {r + 1}: {edit_text}P8 chat {chat_speed['auto'][-1]:.1f} vs {chat_speed[False][-1]:.1f} tok/s "
                f"(drafted {chat_drafts[-1].get('draft_n')}, accepted {chat_drafts[-1].get('draft_n_accepted')})")

        def ratio(d: dict[Any, list[float]]) -> list[float]:
            return [a / b for a, b in zip(d["auto"], d[False], strict=True)]

        rounds = max(3, cfg.rounds // 2)  # a round is ~60 s here
        r = edit_rounds = 0
        while True:
            p7_more = r < rounds or (undecided(ratio(edit_speed), GOALS["p7"]) and r < p7_max_rounds)
            if not (p7_more or (undecided(ratio(chat_speed), GOALS["p8"]) and r < p8_max_rounds)):
                break
            if r >= 2 and late(cfg, "P7/P8", r):
                break
            step(r, with_edit=p7_more)
            r += 1
            edit_rounds += p7_more
        out.update({"rounds": r, "edit_rounds": edit_rounds, "edit_ratio": summary(ratio(edit_speed), GOALS["p7"]),
                    "chat_ratio": summary(ratio(chat_speed), GOALS["p8"]),
                    "edit_tok_s": {str(k): summary(v) for k, v in edit_speed.items()},
                    "chat_tok_s": {str(k): summary(v) for k, v in chat_speed.items()},
                    "identical": identical, "drafts": drafts, "chat_drafts": chat_drafts, "ceiling": batch_ceiling(cold[False]),
                    "edit_text_sha": {str(m): hash(texts[("edit", m)]) for m in ("auto", False)}})
        if not identical["edit"]:  # P7 asserts the same greedy text: a rewrite that changes is not a speed-up
            out["edit_ratio"]["verdict"] = "no"
        if not all(identical.values()):
            # Chat may differ: verifying drafts in a batch changes float rounding, which flips near-tie tokens.
            log(f"P7/P8: greedy text identical with speculation on and off: {identical}")
    finally:
        for e in engines.values():
            e.unload()
    return out
