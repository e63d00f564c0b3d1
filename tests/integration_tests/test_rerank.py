"""Reranking against the real llama-server with a real reranker GGUF: all-MiniLM-L6-v2 plus a seeded one-label
classifier head, converted by llama.cpp's own converter (scripts/make_reranker.py).

Its scores mean nothing (the head is random), so no test asserts an order the model should find: every ordering
and score here is compared with the server's own ``/v1/rerank`` answer for the same query and documents, asked
with httpx directly.

llama-server scores the pairs of a request a few at a time, one per slot, in one physical batch, and a pair's score
moves with its place in that batch (measured on this CPU build: up to 2e-2; which slot takes a pair depends on what
the slots held before). So the servers here run with one slot (``n_parallel=1``): each pair is scored alone and its
score is a function of the pair, which is what makes exact comparisons, and batching, testable. The CLI test runs
the default slots. Through the engine, LangChain's ``ContextualCompressionRetriever`` over a real in-memory vector
store (MiniLM embeddings), and a LlamaIndex query engine (MiniLM embeddings, SmolLM2 answering), sync and async;
batches; the error paths (a chat model given as reranker, no documents, a document over the pair limit); the CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.errors import ContextOverflowError, NotARerankerError
from gguf_provider.langchain import GGUFEmbeddings, GGUFRerank
from gguf_provider.llama_index import GGUF, GGUFEmbedding, GGUFRerankPostprocessor

pytestmark = pytest.mark.slow

QUERY = "How do giant pandas spend their day?"
DOCS = [
    "The giant panda lives in the mountain forests of central China.",
    "Pandas eat bamboo for up to fourteen hours a day.",
    "A sourdough starter is flour and water colonised by wild yeast.",
    "Jupiter is the largest planet in the solar system.",
    "Red pandas are not closely related to giant pandas.",
    "The stock market fell sharply today.",
    "Violins have four strings tuned in fifths.",
    "Giant pandas sleep between meals, often for two to four hours.",
    "Photosynthesis turns sunlight, water and carbon dioxide into sugar.",
    "Bamboo is a grass that can grow nearly a metre in a day.",
]
LONG = " ".join(f"word{i}" for i in range(400))  # well over MiniLM's 512 tokens


def server_answer(engine: Engine, query: str, docs: list[str], **extra: Any) -> list[tuple[int, float]]:
    """The server's own /v1/rerank answer, asked with httpx directly: (index, score), as it orders them."""
    address = engine.info.address
    # timeout: the largest request here (150 documents) takes ~6 s under load; 20x
    with httpx.Client(base_url=address.base_url, transport=address.transport(), headers=address.headers(),
                      timeout=120) as http:
        r = http.post("/v1/rerank", json={"query": query, "documents": docs, **extra})
        r.raise_for_status()
        return [(int(x["index"]), float(x["relevance_score"])) for x in r.json()["results"]]


def _pairs(results: Any) -> list[tuple[int, float]]:
    return [(r.index, r.score) for r in results]


@pytest.fixture(scope="module")
def reranker(reranker_path: Path) -> Iterator[GGUFRerank]:
    r = GGUFRerank(model=str(reranker_path), top_n=3, n_parallel=1)
    r.load()
    yield r
    r.unload()


@pytest.fixture(scope="module")
def minilm(minilm_path: Path) -> Iterator[GGUFEmbeddings]:
    emb = GGUFEmbeddings(model=str(minilm_path))
    yield emb
    emb.unload()


# --- the engine against the server's own answer --------------------------------------------------------------------


async def test_scores_and_order_are_the_servers_own(reranker: GGUFRerank) -> None:
    engine = reranker.engine
    assert "--rerank" in engine.info.log_path.read_text().splitlines()[0]
    want = server_answer(engine, QUERY, DOCS)
    assert sorted(i for i, _ in want) == list(range(len(DOCS)))
    assert _pairs(engine.rerank(QUERY, DOCS)) == want
    assert _pairs(await engine.arerank(QUERY, DOCS)) == want
    assert _pairs(engine.rerank(QUERY, DOCS, top_n=3)) == server_answer(engine, QUERY, DOCS, top_n=3) == want[:3]


async def test_many_documents_in_batches_give_what_one_request_gives(reranker: GGUFRerank) -> None:
    """150 documents: in the default batches of 64 and in batches of 7, the server's answer for all of them in one
    request, and the best 5 of it with top_n (picked over every batch)."""
    engine = reranker.engine
    many = [f"{d} (copy {n})" for n in range(15) for d in DOCS]
    want = server_answer(engine, QUERY, many)
    assert _pairs(engine.rerank(QUERY, many)) == want
    assert _pairs(engine.rerank(QUERY, many, batch_size=7)) == want
    assert _pairs(await engine.arerank(QUERY, many, batch_size=7, top_n=5)) == want[:5]


# --- LangChain: ContextualCompressionRetriever over a real vector store ------------------------------------------


async def test_langchain_contextual_compression_retriever(reranker: GGUFRerank, minilm: GGUFEmbeddings) -> None:
    from langchain_classic.retrievers import ContextualCompressionRetriever
    from langchain_core.documents import Document
    from langchain_core.vectorstores import InMemoryVectorStore

    store = InMemoryVectorStore.from_documents(
        [Document(page_content=d, metadata={"n": i}) for i, d in enumerate(DOCS)], minilm)
    base = store.as_retriever(search_kwargs={"k": 6})
    retriever = ContextualCompressionRetriever(base_compressor=reranker, base_retriever=base)
    retrieved = base.invoke(QUERY)
    assert len(retrieved) == 6
    want = server_answer(reranker.engine, QUERY, [d.page_content for d in retrieved])[:3]
    expected = [(retrieved[i].metadata["n"], score) for i, score in want]
    for got in (retriever.invoke(QUERY), await retriever.ainvoke(QUERY)):
        assert [(d.metadata["n"], d.metadata["relevance_score"]) for d in got] == expected
        assert [d.page_content for d in got] == [DOCS[n] for n, _ in expected]


# --- LlamaIndex: a query engine with the postprocessor -------------------------------------------------------------


async def test_llamaindex_query_engine_with_the_postprocessor(reranker_path: Path, minilm_path: Path,
                                                              smollm2_path: Path) -> None:
    from llama_index.core import Document, VectorStoreIndex
    from llama_index.core.schema import MetadataMode

    embed = GGUFEmbedding(model=str(minilm_path))
    llm = GGUF(model=str(smollm2_path), temperature=0, max_tokens=16)
    post = GGUFRerankPostprocessor(model=str(reranker_path), top_n=2, n_parallel=1)
    try:
        index = VectorStoreIndex.from_documents([Document(text=d) for d in DOCS], embed_model=embed)
        engine = index.as_query_engine(llm=llm, similarity_top_k=5, node_postprocessors=[post])
        retrieved = index.as_retriever(similarity_top_k=5).retrieve(QUERY)
        texts = [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in retrieved]
        want = [(texts[i], score) for i, score in server_answer(post.engine, QUERY, texts)[:2]]
        for response in (engine.query(QUERY), await engine.aquery(QUERY)):
            got = [(n.node.get_content(metadata_mode=MetadataMode.EMBED), n.score) for n in response.source_nodes]
            assert got == want
            assert isinstance(response.response, str)  # SmolLM2 answered from the two kept nodes
    finally:
        for m in (embed, llm, post):
            m.unload()


# --- error paths ---------------------------------------------------------------------------------------------------


async def test_a_chat_model_is_refused_before_any_server_or_request(rt: Any) -> None:
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, TextNode

    lc = GGUFRerank(model=str(rt.model))
    li = GGUFRerankPostprocessor(model=str(rt.model))
    with pytest.raises(NotARerankerError, match="SmolLM2.* is not a reranker") as info:
        lc.compress_documents([Document(page_content="a")], QUERY)
    assert info.value.model == rt.model
    with pytest.raises(NotARerankerError):
        await lc.acompress_documents([Document(page_content="a")], QUERY)
    with pytest.raises(NotARerankerError):
        li.postprocess_nodes([NodeWithScore(node=TextNode(text="a"))], query_str=QUERY)
    assert rt.servers() == [] and rt.registry() == {}


async def test_no_documents_start_nothing(rt: Any, reranker_path: Path) -> None:
    lc = GGUFRerank(model=str(reranker_path))
    li = GGUFRerankPostprocessor(model=str(reranker_path))
    assert lc.compress_documents([], QUERY) == [] and await lc.acompress_documents([], QUERY) == []
    assert li.postprocess_nodes([], query_str=QUERY) == []
    assert await li.apostprocess_nodes([], query_str=QUERY) == []
    assert rt.servers() == []


async def test_a_document_over_the_pair_limit_is_a_typed_error(reranker: GGUFRerank) -> None:
    engine = reranker.engine
    with pytest.raises(ContextOverflowError, match=r"document 1 to rerank is \d+ tokens.*at most 512") as info:
        engine.rerank(QUERY, ["short", LONG])
    assert info.value.n_ctx == 512 and (info.value.n_prompt_tokens or 0) > 512
    with pytest.raises(ContextOverflowError, match="document 0"):
        await engine.arerank(QUERY, [LONG])
    # the server itself refuses the same pair: the limit is its own, not a stricter one of ours
    with pytest.raises(httpx.HTTPStatusError):
        server_answer(engine, QUERY, ["short", LONG])


# --- the CLI -------------------------------------------------------------------------------------------------------


def test_cli_rerank(reranker_path: Path) -> None:
    """The CLI's server runs the default slots, where a pair's score moves with its place in the batch (up to
    :data:`SLOT_TOLERANCE`, the module docstring): each score the CLI prints is the server's own for that document
    within it, in the CLI's own order (by score), each with its document."""
    cli = [sys.executable, "-m", "gguf_provider.cli", "rerank"]
    docs = DOCS[:4]
    held = Engine(EngineConfig(model=str(reranker_path), rerank=True))  # the CLI's server: same model and options
    try:
        want = dict(server_answer(held, QUERY, docs))
        _cli_rerank(cli, reranker_path, docs, want)
    finally:
        held.unload()


SLOT_TOLERANCE = 2e-2  # the most a pair's score moved with its slot, measured on this CPU build (module docstring)


def _cli_rerank(cli: list[str], reranker_path: Path, docs: list[str], want: dict[int, float]) -> None:
    # timeout=120 here: hang guards; the CLI test takes ~4 s under load in all
    out = json.loads(subprocess.run([*cli, "--json", str(reranker_path), QUERY, *docs], capture_output=True,
                                    text=True, timeout=120, check=True).stdout)
    results = out["results"]
    assert [r["rank"] for r in results] == list(range(1, len(docs) + 1))
    assert sorted(r["index"] for r in results) == list(range(len(docs)))
    assert all(r["document"] == docs[r["index"]] for r in results)
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)
    assert all(abs(r["score"] - want[r["index"]]) <= SLOT_TOLERANCE for r in results), (results, want)
    lines = subprocess.run([*cli, str(reranker_path), QUERY, "--top-n", "2"], input="\n".join(docs) + "\n",
                           capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    shown = [line.split(None, 2) for line in lines]
    assert [n for n, _, _ in shown] == ["1", "2"] and all(d in docs for _, _, d in shown), shown
    assert float(shown[0][1]) >= float(shown[1][1])
    assert all(abs(float(score) - want[docs.index(d)]) <= SLOT_TOLERANCE + 1e-4 for _, score, d in shown), shown
    failed = subprocess.run([*cli, str(reranker_path), QUERY, LONG], capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and "at most 512" in failed.stderr
