"""Structured output from a local GGUF model through ChatGGUF, fully offline.

    python integrations/langchain_structured.py ["text to extract from"] [--model NAME_OR_PATH] [--method M]

The default model is Qwen2.5-Coder-0.5B-Instruct. ``with_structured_output`` defaults to ``method="json_schema"``:
llama-server constrains decoding with a grammar built from the pydantic schema, so even a 0.5B model returns valid,
typed JSON. ``function_calling`` (a forced tool call) and ``json_mode`` are the other methods.
"""

from __future__ import annotations

import argparse
import sys
import time

from pydantic import BaseModel, Field

from gguf_provider import ChatGGUF

DEFAULT_MODEL = "Qwen2.5-Coder-0.5B-Instruct"
DEFAULT_TEXT = "Alice is 31 years old and works as a marine biologist in Lyon."


class Person(BaseModel):
    """A person described in the text."""

    name: str = Field(description="the person's first name")
    age: int = Field(description="the person's age in years")
    job: str = Field(description="the person's occupation")
    city: str = Field(description="the city the person lives or works in")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", nargs="?", default=DEFAULT_TEXT)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--method", default="json_schema", choices=["json_schema", "function_calling", "json_mode"])
    p.add_argument("--keep", action="store_true", help="keep the server alive for 5 minutes after exit")
    args = p.parse_args(argv)

    llm = ChatGGUF(model=args.model, temperature=0, max_tokens=200, keep_alive=300 if args.keep else 0)
    t0 = time.monotonic()
    print(f"starting {args.model} ...", flush=True)
    llm.load()
    print(f"ready in {time.monotonic() - t0:.1f} s: pid {llm.engine.info.pid}\n", flush=True)
    extractor = llm.with_structured_output(Person, method=args.method, include_raw=True)
    prompt = f"Extract the person described in this text.\n\nText: {args.text}"
    if args.method == "json_mode":
        prompt += "\n\nReply with a JSON object with the keys name, age, job and city."
    t1 = time.monotonic()
    try:
        out = extractor.invoke(prompt)
    finally:
        llm.unload()
    if out["parsing_error"] is not None:
        print(f"could not parse the reply: {out['parsing_error']}", file=sys.stderr)
        return 1
    person = out["parsed"]
    assert isinstance(person, Person)
    print(person.model_dump_json(indent=2))
    meta = out["raw"].response_metadata
    print(f"\n[{args.method}, {time.monotonic() - t1:.1f} s, {meta.get('tokens_per_second', '?')} tokens/s]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
