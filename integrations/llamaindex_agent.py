"""A LlamaIndex ``FunctionAgent`` with one tool, on a local GGUF model.

    python integrations/llamaindex_agent.py ["your question"] [--model NAME] [--keep]

The agent streams its events: tool calls as the model makes them, the tool's results, then the answer. The chat
template's native tool-call format is used; calls the model writes as text are healed into real calls.

The agent's first step always calls the tool (``initial_tool_choice``: a constrained call, so even a 0.5B model
never answers from memory instead). The default 0.5B model, shown the tool's result, tends to call the tool again
instead of answering; so by default the tool's result *is* the answer (``return_direct``). With a larger model pass
``--compose`` to let the model phrase the answer from the result.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from llama_index.core.agent.workflow import AgentStream, FunctionAgent, ToolCall, ToolCallResult
from llama_index.core.tools import FunctionTool

from gguf_provider.llama_index import GGUF

DEFAULT_MODEL = "Qwen2.5-Coder-0.5B-Instruct"

PRICES = {"apple": 0.5, "banana": 0.25, "cherry": 4.0, "mango": 1.75}


def fruit_price(fruit: str) -> str:
    """Look up the price in euros of one kilogram of a fruit (apple, banana, cherry or mango)."""
    name = fruit.strip().lower()
    price = PRICES.get(name) or PRICES.get(name.removesuffix("s")) or PRICES.get(name.removesuffix("ies") + "y")
    return f"{fruit}: {price:.2f} EUR per kg" if price is not None else f"no price known for {fruit!r}"


def make_agent(llm: GGUF, *, compose: bool = False) -> FunctionAgent:
    return FunctionAgent(
        tools=[FunctionTool.from_defaults(fruit_price, return_direct=not compose)], llm=llm,
        initial_tool_choice="fruit_price",  # the first step calls the tool; later ones are the model's choice
        system_prompt="You answer questions about fruit prices. Always look prices up with the fruit_price tool, "
                      "then answer in one short sentence.")


async def run(question: str, llm: GGUF, *, compose: bool = False) -> str:
    handler = make_agent(llm, compose=compose).run(user_msg=question)
    async for ev in handler.stream_events():
        if isinstance(ev, ToolCallResult):
            print(f"\n[tool] {ev.tool_name}({ev.tool_kwargs}) -> {ev.tool_output.content}", flush=True)
        elif isinstance(ev, ToolCall):
            print(f"[call] {ev.tool_name}({ev.tool_kwargs})", flush=True)
        elif isinstance(ev, AgentStream) and ev.delta:
            print(ev.delta, end="", flush=True)
    result = await handler
    return str(result)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("question", nargs="?", default="How much does a kilogram of cherries cost?")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--compose", action="store_true", help="let the model write the answer from the tool result")
    p.add_argument("--keep", action="store_true", help="keep the server alive for 5 minutes after exit")
    args = p.parse_args(argv)

    llm = GGUF(model=args.model, n_ctx=4096, temperature=0, max_tokens=args.max_tokens,
               keep_alive=300 if args.keep else 0)
    print(f"> {args.question}\n", flush=True)
    answer = asyncio.run(run(args.question, llm, compose=args.compose))
    print(f"\n\nfinal answer: {answer}")
    llm.unload()
    return 0


if __name__ == "__main__":
    sys.exit(main())
