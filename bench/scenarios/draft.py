"""P16: speculation with a draft model: Qwen2.5-Coder-1.5B with the 0.5B as its draft (same tokenizer), against
speculation off and against the automatic default (n-gram self-speculation), on P7/P8's code-edit and chat tasks.

Three servers of the target (``speculative=<0.5B path>``, ``"auto"``, ``False``), ``cfg.peer_threads`` threads each,
the same greedy requests in every round (order rotated), decode tok/s from the server's timings, each prompt cached
before it is timed (as P7/P8). Shorter replies than P7/P8's (200 and 100 tokens) and two rounds: the 1.5B decodes
at ~7 tok/s on one thread, ~4 with the draft, and P16's verdicts are far from their goals. The greedy text is compared with speculation off: a draft only proposes, the target
decides, but verifying a batch rounds differently from one token at a time, so a near tie can flip.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.config import GOALS, N_CTX, Config
from bench.log import log
from bench.rounds import adaptive
from bench.scenarios.speculative import (
    CHAT_TASK,
    CHAT_TOPICS,
    EDIT_SOURCE,
    EDIT_TASK,
    batch_ceiling,
    spec_request,
)
from bench.stats import summary
from gguf_provider.engine import Engine, EngineConfig

MODES = ("draft", "auto", "off")
EDIT_TOKENS, CHAT_TOKENS = 200, 100
ROUNDS = 2  # + 2 while the code edit's verdict is within noise


def bench_draft(cfg: Config, target: Path, draft: Path) -> dict[str, Any]:
    edit = EDIT_TASK.format(source=EDIT_SOURCE.read_text())
    n = str(cfg.peer_threads)
    spec: dict[str, bool | str] = {"draft": str(draft), "auto": "auto", "off": False}
    engines = {m: Engine(EngineConfig(model_path=str(target), n_ctx=N_CTX, n_parallel=1, keep_alive=0, shared=False,
                                      speculative=spec[m], server_args=("-t", n, "-tb", n))) for m in MODES}
    out: dict[str, Any] = {"target": target.name, "draft": draft.name, "threads": cfg.peer_threads,
                           "edit_tokens": EDIT_TOKENS, "chat_tokens": CHAT_TOKENS}
    speed: dict[str, dict[str, list[float]]] = {t: {m: [] for m in MODES} for t in ("edit", "chat")}
    same: dict[str, dict[str, int]] = {t: {m: 0 for m in MODES} for t in ("edit", "chat")}
    drafted: dict[str, list[tuple[int, int]]] = {m: [] for m in MODES}
    try:
        for e in engines.values():
            e.load()
        # the edit prompt is cached from here on (~1,600 tokens at ~21 tok/s): "off" alone, as its timings give the
        # batch ceiling, then the two others at once (one thread each, on a core each)
        cold = spec_request(engines["off"], edit, 8)[1]
        with ThreadPoolExecutor(2) as pool:
            for f in [pool.submit(spec_request, engines[m], edit, 8) for m in ("draft", "auto")]:
                f.result()

        def step(r: int) -> None:
            order = list(MODES[r % 3:] + MODES[:r % 3])
            chat = CHAT_TASK.format(topic=CHAT_TOPICS[-10 - r])
            for task, content, tokens in (("edit", edit, EDIT_TOKENS), ("chat", chat, CHAT_TOKENS)):
                texts: dict[str, str] = {}
                for m in order:
                    texts[m], t = spec_request(engines[m], content, tokens)
                    speed[task][m].append(float(t.get("predicted_per_second") or 0.0))
                    drafted[m].append((int(t.get("draft_n") or 0), int(t.get("draft_n_accepted") or 0)))
                for m in MODES:
                    same[task][m] += texts[m] == texts["off"]
            log(f"P16 round {r + 1}: " + "; ".join(
                f"{task} " + ", ".join(f"{m} {speed[task][m][-1]:.1f}" for m in MODES) + " tok/s"
                for task in speed))

        def ratio(task: str, m: str) -> list[float]:
            return [a / b for a, b in zip(speed[task][m], speed[task]["off"], strict=True)]

        def worst() -> list[float]:  # more rounds while the edit verdict is undecided
            return ratio("edit", "draft")

        out["rounds"] = adaptive(replace(cfg, rounds=ROUNDS, max_rounds=ROUNDS + 2), "P16", step, worst,
                                 GOALS["p16_edit"], least=1)
        out.update({
            "edit_ratio": summary(ratio("edit", "draft"), GOALS["p16_edit"]),
            "chat_ratio": summary(ratio("chat", "draft"), GOALS["p16_chat"]),
            "edit_auto_ratio": summary(ratio("edit", "auto")),
            "chat_auto_ratio": summary(ratio("chat", "auto")),
            "edit_draft_vs_auto": summary([a / b for a, b in zip(speed["edit"]["draft"], speed["edit"]["auto"],
                                                                 strict=True)]),
            "chat_draft_vs_auto": summary([a / b for a, b in zip(speed["chat"]["draft"], speed["chat"]["auto"],
                                                                 strict=True)]),
            "tok_s": {t: {m: summary(v) for m, v in d.items()} for t, d in speed.items()},
            "same_text_as_off": same,
            "accepted": {m: [sum(a for _, a in v), sum(d for d, _ in v)] for m, v in drafted.items()},
            "ceiling": batch_ceiling(cold),
        })
    finally:
        for e in engines.values():
            e.unload()
    return out


def rows(p: dict[str, Any]) -> list[tuple[str, str, dict[str, Any], int, str]]:
    what = f"({p['target']}, draft {p['draft']})"
    return [
        (f"P16 code-edit decode tok/s, draft model ÷ speculation off {what}", "llama-server", p["edit_ratio"], 2, ""),
        (f"P16 chat decode tok/s, draft model ÷ speculation off {what}", "llama-server", p["chat_ratio"], 3, ""),
        ("P16 code-edit decode tok/s, draft model ÷ the default (n-gram)", "llama-server", p["edit_draft_vs_auto"], 2,
         ""),
        ("P16 chat decode tok/s, draft model ÷ the default (n-gram)", "llama-server", p["chat_draft_vs_auto"], 3, ""),
    ]


def notes(p: dict[str, Any]) -> list[str]:
    t = p["tok_s"]
    acc = p["accepted"]
    return [f"P16 ({p['target']} with {p['draft']} as draft, {p['threads']} thread(s), {p['rounds']} rounds, decode "
            f"tok/s from the server's timings): code edit " + ", ".join(f"{m} {t['edit'][m]['median']:.1f}" for m in MODES)
            + "; chat " + ", ".join(f"{m} {t['chat'][m]['median']:.1f}" for m in MODES)
            + f" tok/s; drafted tokens accepted: draft model {acc['draft'][0]}/{acc['draft'][1]}, n-gram "
            f"{acc['auto'][0]}/{acc['auto'][1]}; greedy text the same as with speculation off (rounds): "
            + "; ".join(f"{task} " + ", ".join(f"{m} {v}" for m, v in d.items() if m != "off")
                        for task, d in p["same_text_as_off"].items())
            + f"; batch ceiling {p['ceiling']['ratio']:.2f}x."]
