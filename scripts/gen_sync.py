"""Write the sync I/O paths from their async source: each path is written once.

In each module listed in ``MODULES``, the code between ``# unasync: async source`` and ``# unasync: generated``
is the one source (async); this script writes its sync copy between ``# unasync: generated`` and
``# unasync: end`` with the ``unasync`` package (httpcore's way): ``async``/``await`` dropped, ``async for`` and
``async with`` made plain, ``AsyncIterator`` made ``Iterator``, and each name in :data:`REPLACEMENTS` (the async
methods' ``a`` prefix; httpx's async names; :mod:`gguf_provider._io`'s pairs) replaced by its sync counterpart.
Comments and docstrings are copied as they are: write them for both.

Usage: ``python scripts/gen_sync.py`` (``--check`` exits 1 when a module's sync copy is out of date; a unit test
does the same).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = [ROOT / "gguf_provider" / name for name in (
    "client.py", "engine.py", "chat.py", "media.py", "options.py", "langchain/chat_models.py",
    "langchain/embeddings.py", "langchain/rerank.py", "llama_index/llms.py", "llama_index/embeddings.py",
    "llama_index/postprocessor.py")]
SOURCE = "# unasync: async source"
GENERATED = "# unasync: generated from the async source above by scripts/gen_sync.py; do not edit"
END = "# unasync: end"

# Async name -> sync name, beyond unasync's own (AsyncIterator, asynccontextmanager, __aenter__, Async* -> Sync*).
REPLACEMENTS = {
    # our async methods and functions
    **{f"a{name}": name for name in (
        "get_json", "post_json", "stream_chat", "tokenize", "apply_template", "embed", "rerank", "guard", "retrying",
        "prepare", "restore_prompt", "count_prompt_tokens", "stream", "load", "fetch", "complete", "chat",
        "stream_complete", "structured_predict", "embed_documents", "embed_query", "compress_documents")},
    **{f"_a{name}": f"_{name}" for name in (
        "events", "request", "generate", "stream", "get_query_embedding", "get_text_embedding",
        "get_text_embeddings", "postprocess_nodes")},
    # the frameworks' async names
    "agenerate_from_stream": "generate_from_stream", "AsyncCallbackManagerForLLMRun": "CallbackManagerForLLMRun",
    "ChatResponseAsyncGen": "ChatResponseGen", "CompletionResponseAsyncGen": "CompletionResponseGen",
    # httpx and contextlib
    "ahttp": "http", "aread": "read", "aiter_lines": "iter_lines", "aiter_bytes": "iter_bytes", "aclose": "close",
    "AsyncClient": "Client", "AsyncHTTPTransport": "HTTPTransport", "AsyncBaseTransport": "BaseTransport",
    "aclosing": "closing",
    # gguf_provider._io: what differs between a coroutine and a plain call
    "off_loop": "in_caller", "gather": "collect", "running_loop": "no_loop",
}
_BLOCK = re.compile(rf"(?P<source>^[ \t]*{re.escape(SOURCE)}\n(?P<body>.*?))(?P<gen>^[ \t]*{re.escape(GENERATED)}\n)"
                    rf".*?(?P<end>^[ \t]*{re.escape(END)}\n)", re.S | re.M)


def unasync_text(text: str) -> str:
    import unasync  # a dev tool: the test extra has it

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "_async" / "block.py"
        src.parent.mkdir()
        src.write_text(text)
        unasync.unasync_files([str(src)], [unasync.Rule("/_async/", "/_sync/", REPLACEMENTS)])
        return (Path(tmp) / "_sync" / "block.py").read_text()


def realign(source: str, generated: str) -> str:
    """Continuation lines of a signature or call that unasync shortened (``async def astream(`` -> ``def stream(``)
    moved left by as much, so that they stay aligned under its opening parenthesis."""
    out, shift, depth = [], 0, 0
    for src, gen in zip(source.split("\n"), generated.split("\n"), strict=True):
        if depth > 0 and shift > 0 and gen.startswith(" " * shift):
            gen = gen[shift:]
        elif depth <= 0:
            shift = len(src) - len(gen) if gen.rstrip().endswith(("(", ",")) else 0
        depth += gen.count("(") + gen.count("[") - gen.count(")") - gen.count("]")
        depth = max(depth, 0)
        out.append(gen)
    return "\n".join(out)


def render(path: Path) -> str:
    """``path``'s text with every generated block written anew from its async source."""
    text = path.read_text()

    def block(m: re.Match[str]) -> str:
        body = m.group("body")
        return m.group("source") + m.group("gen") + realign(body, unasync_text(body)) + m.group("end")

    out, n = _BLOCK.subn(block, text)
    if n == 0:
        raise ValueError(f"{path.relative_to(ROOT)} has no `{SOURCE}` ... `{GENERATED}` ... `{END}` block")
    return out


def main(argv: list[str]) -> int:
    stale = 0
    for path in MODULES:
        text = render(path)
        if text == path.read_text():
            continue
        if "--check" in argv:
            print(f"{path.relative_to(ROOT)}: its sync code is out of date: run python scripts/gen_sync.py")
            stale = 1
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return stale


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
