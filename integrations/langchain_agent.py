"""A tool-calling agent loop on a local GGUF model through ChatGGUF, fully offline.

    python integrations/langchain_agent.py ["your question"] [--model NAME_OR_PATH] [--require-tool] [--keep]

The default model is Qwen2.5-Coder-0.5B-Instruct (its template declares tools). The loop is the classic one:
the model answers or calls tools; tool results go back as ToolMessages; repeat. ``tool_choice="auto"`` leaves the
choice to the model, and gguf-provider heals calls that the 0.5B model writes as plain JSON text into real tool
calls. After tool results, a one-line nudge asks for the answer: without it the tiny model tends to repeat its
call instead of answering. ``--require-tool`` makes the first step call a tool (``tool_choice="required"``, a
constrained call) for questions a tool must answer: a tiny model may otherwise answer from memory.
"""

from __future__ import annotations

import argparse
import sys
import time

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from gguf_provider import ChatGGUF

DEFAULT_MODEL = "Qwen2.5-Coder-0.5B-Instruct"
NUDGE = "Answer my question in one sentence using that tool result."


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    # A stand-in for a real weather API: the point is the loop, and this runs offline.
    return f"It is sunny and 21 degrees Celsius in {city}."


TOOLS = [get_weather]  # add your own; a 0.5B model is most reliable with few tools


def run_agent(llm: ChatGGUF, question: str, max_steps: int = 5, *, require_tool: bool = False) -> list[BaseMessage]:
    by_name = {t.name: t for t in TOOLS}
    bound = llm.bind_tools(TOOLS, tool_choice="auto")
    first = llm.bind_tools(TOOLS, tool_choice="required") if require_tool else bound
    messages: list[BaseMessage] = [HumanMessage(question)]
    for step in range(1, max_steps + 1):
        ai = (first if step == 1 else bound).invoke(messages)
        messages.append(ai)
        if not ai.tool_calls:
            return messages
        for tc in ai.tool_calls:
            result = by_name[tc["name"]].invoke(tc["args"]) if tc["name"] in by_name else f"no tool {tc['name']}"
            print(f"[step {step}] tool call {tc['name']}({tc['args']}) -> {result}", flush=True)
            messages.append(ToolMessage(str(result), tool_call_id=tc["id"], name=tc["name"]))
        messages.append(HumanMessage(NUDGE))
    raise RuntimeError(f"no final answer after {max_steps} steps")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("question", nargs="?", default="What's the weather like in Paris right now?")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--require-tool", action="store_true", help="the first step must call a tool")
    p.add_argument("--keep", action="store_true", help="keep the server alive for 5 minutes after exit")
    args = p.parse_args(argv)

    llm = ChatGGUF(model=args.model, temperature=0, max_tokens=200, keep_alive=300 if args.keep else 0)
    t0 = time.monotonic()
    print(f"starting {args.model} ...", flush=True)
    llm.load()
    info = llm.engine.info
    print(f"ready in {time.monotonic() - t0:.1f} s: context {info.n_ctx} tokens, pid {info.pid}\n", flush=True)
    print(f"> {args.question}\n", flush=True)
    try:
        messages = run_agent(llm, args.question, require_tool=args.require_tool)
    finally:
        llm.unload()
    final = messages[-1]
    assert isinstance(final, AIMessage)
    calls = sum(len(m.tool_calls) for m in messages if isinstance(m, AIMessage))
    print(f"\n{final.content}\n\n[{calls} tool call(s), {len(messages)} messages]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
