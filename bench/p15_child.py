"""P15 child: LangChain's ``HuggingFaceEmbeddings`` (sentence-transformers on torch, CPU) in its own process, so
torch's threads and memory stay out of the bench process.

``python bench/p15_child.py MODEL_FOLDER THREADS MAX_SEQ_LENGTH`` loads the model once (``HF_HUB_OFFLINE=1``) and
prints one JSON line: import and load seconds, the batch size ``embed_documents`` uses, torch's thread count. Then it
answers one JSON line per command line on stdin:

- ``{"texts": PATH}``: read the documents (a JSON list of strings) and ``{"queries": [...]}`` from PATH;
- ``{"embed": [START, STOP], "save": PATH | null}``: ``embed_documents`` of documents START to STOP, timed around
  the call only; with ``save``, the vectors go to PATH (float32 ``.npy``);
- ``{"query": PATH}``: ``embed_query`` of each query, saved to PATH.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time


def main() -> None:
    folder, threads, max_seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    from langchain_huggingface import HuggingFaceEmbeddings
    from sentence_transformers import SentenceTransformer

    t1 = time.perf_counter()
    emb = HuggingFaceEmbeddings(model_name=folder)
    default_max_seq = emb._client.max_seq_length
    emb._client.max_seq_length = max_seq
    t2 = time.perf_counter()
    batch = emb.encode_kwargs.get("batch_size", inspect.signature(SentenceTransformer.encode).parameters["batch_size"].default)
    print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "batch_size": batch, "threads": torch.get_num_threads(),
                      "max_seq_length": max_seq, "default_max_seq_length": default_max_seq,
                      "torch": torch.__version__}), flush=True)
    texts: list[str] = []
    queries: list[str] = []
    for line in sys.stdin:
        cmd = json.loads(line)
        if "texts" in cmd:
            with open(cmd["texts"], encoding="utf-8") as f:
                data = json.load(f)
            texts, queries = data["texts"], data["queries"]
            print(json.dumps({"ok": len(texts)}), flush=True)
        elif "embed" in cmd:
            start, stop = cmd["embed"]
            docs = texts[start:stop]
            t = time.perf_counter()
            vectors = emb.embed_documents(docs)
            s = time.perf_counter() - t
            if cmd.get("save"):
                np.save(cmd["save"], np.asarray(vectors, dtype=np.float32))
            print(json.dumps({"s": s, "n": len(vectors)}), flush=True)
        elif "query" in cmd:
            np.save(cmd["query"], np.asarray([emb.embed_query(q) for q in queries], dtype=np.float32))
            print(json.dumps({"ok": len(queries)}), flush=True)
        else:
            raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
