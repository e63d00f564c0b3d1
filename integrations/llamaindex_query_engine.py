"""Ask questions about this project's own docs with LlamaIndex, fully offline on local GGUF models.

    python integrations/llamaindex_query_engine.py ["your question"] [--docs DIR_OR_FILE ...] [--model NAME]
                                                   [--embed-model NAME] [--top-k 2] [--keep]

A ``VectorStoreIndex`` over ``docs/`` (plus any other directory or file given with ``--docs``), embedded by
``GGUFEmbedding`` (all-MiniLM-L6-v2 by default) on its own ``--embedding`` llama-server, queried with ``GGUF`` and the answer streamed token by
token, followed by the source passages it was built from. Both servers are started by gguf-provider and stopped
when the script ends (``--keep`` leaves them running for five minutes).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from llama_index.core import Document, SimpleDirectoryReader, VectorStoreIndex
from llama_index.core.base.response.schema import StreamingResponse
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.query_engine import BaseQueryEngine

from gguf_provider.llama_index import GGUF, GGUFEmbedding

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = "Qwen2.5-Coder-0.5B-Instruct"
DEFAULT_EMBED_MODEL = "all-MiniLM-L6-v2"  # a real embedder (BERT, 384 dims); chat models rank poorly
TEXT_EXTS = [".md", ".txt", ".rst"]


def load_documents(paths: Sequence[str | Path]) -> list[Document]:
    """Every text file (.md, .txt, .rst) under the given directories, plus the given files."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in TEXT_EXTS)
        elif p.is_file():
            files.append(p)
    files = [f for f in dict.fromkeys(files) if f.stat().st_size > 0]
    if not files:
        raise SystemExit(f"no text files ({', '.join(TEXT_EXTS)}) under {', '.join(map(str, paths))}")
    docs: list[Document] = SimpleDirectoryReader(input_files=[str(f) for f in files]).load_data()
    return docs


def build_query_engine(documents: Sequence[Document], llm: GGUF, embed_model: GGUFEmbedding, *,
                       top_k: int = 2, chunk_size: int = 256, streaming: bool = True) -> BaseQueryEngine:
    # Chunks well under MiniLM's 512-token context (it was trained on 256): a longer chunk would be refused.
    index = VectorStoreIndex.from_documents(
        documents, embed_model=embed_model,
        transformations=[SentenceSplitter(chunk_size=chunk_size, chunk_overlap=64)])
    return index.as_query_engine(llm=llm, similarity_top_k=top_k, streaming=streaming)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("question", nargs="?", default="How does gguf-provider start and share llama-server?")
    p.add_argument("--docs", action="append", help="a directory or file to index (repeatable; default docs/, "
                                                   "and README.md when docs/ has no text)")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--embed-model", default=DEFAULT_EMBED_MODEL)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--keep", action="store_true", help="keep the servers alive for 5 minutes after exit")
    args = p.parse_args(argv)

    paths: list[str | Path] = list(args.docs or [ROOT / "docs"])
    if not args.docs and not any(f.suffix in TEXT_EXTS for f in (ROOT / "docs").rglob("*")):
        paths.append(ROOT / "README.md")
    keep_alive = 300 if args.keep else 0
    llm = GGUF(model=args.model, n_ctx=args.n_ctx, temperature=0, max_tokens=args.max_tokens,
               keep_alive=keep_alive)
    embed = GGUFEmbedding(model=args.embed_model, keep_alive=keep_alive)

    t0 = time.monotonic()
    documents = load_documents(paths)
    print(f"indexing {len(documents)} documents with {args.embed_model} ...", flush=True)
    engine = build_query_engine(documents, llm, embed, top_k=args.top_k)
    print(f"index ready in {time.monotonic() - t0:.1f} s; starting {args.model} ...", flush=True)
    print(f"context window {llm.metadata.context_window} tokens\n\n> {args.question}\n", flush=True)

    response = engine.query(args.question)
    assert isinstance(response, StreamingResponse)
    for token in response.response_gen:
        print(token, end="", flush=True)
    print("\n\nsources:")
    for node in response.source_nodes:
        name = Path(node.metadata.get("file_path", "?")).name
        snippet = " ".join(node.get_content().split())[:90]
        print(f"  [{node.score or 0:.3f}] {name}: {snippet}...")
    llm.unload()
    embed.unload()
    return 0


if __name__ == "__main__":
    sys.exit(main())
