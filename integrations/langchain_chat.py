"""Stream an answer from a local GGUF model through ChatGGUF (what `make demo` runs).

    python integrations/langchain_chat.py ["your question"] [--model NAME_OR_PATH] [--keep]

The llama-server is started by gguf-provider itself and stopped when the script ends (``--keep`` leaves it
running for five minutes so the next run attaches to it at once).
"""

from __future__ import annotations

import argparse
import sys
import time

from langchain_core.messages import HumanMessage, SystemMessage

from gguf_provider import ChatGGUF

DEFAULT_MODEL = "SmolLM2-135M-Instruct"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("question", nargs="?", default="In three sentences: why do local language models matter?")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--keep", action="store_true", help="keep the server alive for 5 minutes after exit")
    args = p.parse_args(argv)

    llm = ChatGGUF(model=args.model, temperature=0.7, seed=42, max_tokens=args.max_tokens,
                   keep_alive=300 if args.keep else 0)
    t0 = time.monotonic()
    print(f"starting {args.model} ...", flush=True)
    llm.load()
    info = llm.engine.info
    print(f"ready in {time.monotonic() - t0:.1f} s: context {info.n_ctx} tokens, pid {info.pid}, "
          f"{info.address.describe()}\n", flush=True)
    print(f"> {args.question}\n", flush=True)
    last = None
    for chunk in llm.stream([SystemMessage("You are a concise, helpful assistant."), HumanMessage(args.question)]):
        if chunk.content:
            print(chunk.content, end="", flush=True)
        last = chunk
    meta = last.response_metadata if last is not None else {}
    usage = last.usage_metadata if last is not None else None
    print(f"\n\n[{meta.get('model_name')}: {usage['output_tokens'] if usage else '?'} tokens, "
          f"{meta.get('tokens_per_second', '?')} tokens/s, finish: {meta.get('finish_reason')}]")
    llm.unload()
    return 0


if __name__ == "__main__":
    sys.exit(main())
