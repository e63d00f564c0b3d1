"""Write notebooks/rag.ipynb's cells (LlamaIndex retrieval with a real embedder) and execute it with nbclient,
saving the real outputs.

    python tests/support/make_rag_notebook.py [--no-execute]
"""

from __future__ import annotations

import sys

import nbformat

from tests.support import make_notebook
from tests.support.make_notebook import ROOT, execute

NOTEBOOK = ROOT / "notebooks" / "rag.ipynb"

CELLS = [
    ("md", "# Questions over your own text, offline\n\nA LlamaIndex vector index embedded by a real embedding model "
           "(all-MiniLM-L6-v2, 384 dims) and answered by a small chat model, both local GGUF files on their own "
           "llama-servers. Use an embedding model for the index: a chat model's vectors rank documents poorly "
           "(see docs/embeddings.md)."),
    ("code", "from llama_index.core import Document, Settings, VectorStoreIndex\n"
             "from gguf_provider.llama_index import GGUF, GGUFEmbedding\n\n"
             'Settings.embed_model = GGUFEmbedding(model="all-MiniLM-L6-v2")\n'
             "facts = [\n"
             '    "The Eiffel Tower in Paris was completed in 1889 and is 330 metres tall.",\n'
             '    "Jupiter is the largest planet in the solar system, a gas giant with the Great Red Spot.",\n'
             '    "A sourdough starter is flour and water colonised by wild yeast and lactic acid bacteria.",\n'
             '    "Violins have four strings tuned in fifths and are played with a bow strung with horsehair.",\n'
             "]\n"
             "index = VectorStoreIndex.from_documents([Document(text=t) for t in facts])"),
    ("md", "The retriever alone: the closest passage and its cosine similarity."),
    ("code", 'hit = index.as_retriever(similarity_top_k=1).retrieve("Which planet is the biggest one orbiting '
             'our Sun?")[0]\nprint(f"{hit.score:.3f}", hit.text)'),
    ("md", "The query engine puts the retrieved passage in the prompt of the chat model; the response keeps it as "
           "its source."),
    ("code", 'llm = GGUF(model="Qwen2.5-Coder-0.5B-Instruct", temperature=0, n_ctx=2048)\n'
             'answer = index.as_query_engine(llm=llm, similarity_top_k=1).query("What makes sourdough bread '
             'rise?")\nprint(answer)\nprint("source:", answer.source_nodes[0].text)'),
    ("code", "llm.unload()\nSettings.embed_model.unload()"),
]


def build() -> nbformat.NotebookNode:
    return make_notebook.build(CELLS)


def main(argv: list[str]) -> int:
    nb = build()
    if "--no-execute" not in argv:
        execute(nb, ROOT / "notebooks")
    nbformat.write(nb, NOTEBOOK)
    print(NOTEBOOK)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
