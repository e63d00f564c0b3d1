"""A real embedder: all-MiniLM-L6-v2 (BERT, 384 dims, mean pooling in its header, 512-token context), converted by
llama.cpp's own converter (scripts/test_models.py), through GGUFEmbeddings, GGUFEmbedding and the CLI.

No test here asserts what the model makes of a text (which document it ranks first, whether a paraphrase is
nearer): that is the model's quality, and moves with the CPU's rounding. Values that depend on the model and the
CPU (a cosine, a vector) are compared with the same server's own answers, never with a number written here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.errors import ContextOverflowError
from gguf_provider.langchain import GGUFEmbeddings
from gguf_provider.llama_index import GGUFEmbedding

pytestmark = pytest.mark.slow

DOCS = [
    "The Eiffel Tower in Paris was completed in 1889 and is 330 metres tall.",
    "Photosynthesis lets plants turn sunlight, water and carbon dioxide into sugar and oxygen.",
    "A sourdough starter is a mix of flour and water colonised by wild yeast and lactic acid bacteria.",
    "The Great Barrier Reef off Queensland is the world's largest coral reef system.",
    "Python lists are mutable sequences; tuples are immutable and can be used as dictionary keys.",
    "To change a flat bicycle tyre, remove the wheel, lever off the tyre and patch or replace the inner tube.",
    "Jupiter is the largest planet in the solar system, a gas giant with a storm called the Great Red Spot.",
    "Regular aerobic exercise lowers resting heart rate and blood pressure.",
    "The French Revolution began in 1789 with the storming of the Bastille.",
    "Violins have four strings tuned in fifths and are played with a bow strung with horsehair.",
]
QUESTIONS = [
    "How high is the famous iron landmark in the French capital?",
    "How do green plants make their food from light?",
    "What makes naturally leavened bread rise?",
    "Where can you find the biggest coral ecosystem on Earth?",
    "Which Python collection type cannot be modified after creation?",
    "My bike has a puncture, how do I fix it?",
    "Which planet is the biggest one orbiting our Sun?",
    "What does running or cycling do for the cardiovascular system?",
    "When did the uprising that overthrew the French monarchy start?",
    "What is the bowed string instrument with four strings made of?",
]


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (math.hypot(*a) * math.hypot(*b))


@pytest.fixture(scope="module")
def minilm(minilm_path: Path) -> Iterator[GGUFEmbeddings]:
    emb = GGUFEmbeddings(model=str(minilm_path))
    emb.embed_query("warm up")
    yield emb
    emb.unload()


def test_a_chat_model_embeds_mean_pooled(smollm2_path: Path) -> None:
    """SmolLM2's header names no pooling: the library starts its server with `--pooling mean`, and the vectors have
    the model's width (576) and unit length."""
    emb = GGUFEmbeddings(model=str(smollm2_path))
    try:
        vectors = emb.embed_documents(DOCS[:2])
        first = emb.engine.info.log_path.read_text().splitlines()[0] if emb.engine.info.log_path else ""
        assert "--pooling mean" in first, first
        assert [len(v) for v in vectors] == [576, 576]
        assert all(abs(math.hypot(*v) - 1.0) < 1e-3 for v in vectors)
    finally:
        emb.unload()


def test_pooling_comes_from_the_header(minilm: GGUFEmbeddings, minilm_path: Path) -> None:
    """No `--pooling` on the command line: the server runs MiniLM with the mean pooling its header names (its vector
    is the mean of the token vectors that a `--pooling none` server of the same model gives, normalised), and its
    vectors are 384-dim and L2-normalised."""
    info = minilm.engine.info
    first = info.log_path.read_text().splitlines()[0] if info.log_path else ""
    assert "--embedding" in first and "--pooling" not in first
    texts = ["A cat sits on the mat.", "A kitten is resting on a rug.", "The stock market fell sharply today."]
    vectors = minilm.embed_documents(texts)
    assert [len(v) for v in vectors] == [384] * 3
    assert all(abs(math.hypot(*v) - 1.0) < 1e-3 for v in vectors)
    per_token = Engine(EngineConfig(model_path=str(minilm_path), embedding=True, pooling="none", keep_alive=0))
    try:
        for text, vector in zip(texts, vectors, strict=True):
            (row,) = per_token.client.post_json("/embedding", {"content": text})
            tokens = row["embedding"]
            assert len(tokens) == len(minilm.engine.tokenize(text))  # one vector per token, [CLS] and [SEP] included
            mean = [sum(col) / len(tokens) for col in zip(*tokens, strict=True)]
            assert _cos(mean, vector) > 0.999
    finally:
        per_token.unload()


async def test_query_equals_document_sync_and_async(minilm: GGUFEmbeddings) -> None:
    q = "Which planet has the Great Red Spot?"
    assert minilm.embed_query(q) == pytest.approx(minilm.embed_documents([q])[0], abs=1e-5)
    assert (await minilm.aembed_query(q)) == pytest.approx(minilm.embed_query(q), abs=1e-5)
    many = [f"sentence number {i} about nothing in particular" for i in range(70)]  # three batches of 32
    assert len(await minilm.aembed_documents(many)) == len(minilm.embed_documents(many)) == 70


LONG = " ".join(f"word{i}" for i in range(400))  # well over 512 WordPiece tokens


async def test_a_text_over_the_context_is_a_typed_error_by_default(minilm: GGUFEmbeddings) -> None:
    with pytest.raises(ContextOverflowError, match=r"text 1 to embed is \d+ tokens .* at most 512") as info:
        minilm.embed_documents(["short", LONG])
    assert info.value.n_ctx == 512 and (info.value.n_prompt_tokens or 0) > 512
    with pytest.raises(ContextOverflowError, match="truncate=True"):
        await minilm.aembed_query(LONG)


async def test_truncate_embeds_the_first_tokens(minilm: GGUFEmbeddings, minilm_path: Path) -> None:
    cut = GGUFEmbeddings(model=str(minilm_path), truncate=True)
    try:
        whole = cut.embed_query(LONG)
        assert len(whole) == 384
        # The first 510 tokens between [CLS] and [SEP]: the same vector as the text cut there by hand.
        tokens = minilm.engine.tokenize(LONG, special=False)[:510]
        head = minilm.engine.client.post_json("/detokenize", {"tokens": tokens})["content"]
        assert _cos(whole, minilm.embed_query(head)) > 0.999
        assert _cos(await cut.aembed_query(LONG), whole) > 0.999
    finally:
        cut.unload()


def test_llamaindex_embedding_ranks_like_langchain(minilm: GGUFEmbeddings, minilm_path: Path) -> None:
    emb = GGUFEmbedding(model=str(minilm_path))
    try:
        # The same model's vectors, so the same ranking: each question's first document by LlamaIndex's vectors is
        # LangChain's first, or within rounding of it (a near tie may order either way).
        docs, lc_docs = emb.get_text_embedding_batch(DOCS), minilm.embed_documents(DOCS)
        for q in QUESTIONS:
            qv, lc_qv = emb.get_query_embedding(q), minilm.embed_query(q)
            assert qv == pytest.approx(lc_qv, abs=1e-4)
            best = max(range(len(DOCS)), key=lambda j: _cos(qv, docs[j]))
            assert _cos(lc_qv, lc_docs[best]) >= max(_cos(lc_qv, d) for d in lc_docs) - 1e-3
    finally:
        emb.unload()


def test_cli_embed(minilm: GGUFEmbeddings, minilm_path: Path) -> None:
    # timeout=120: hang guards; each run takes ~1.3 s under load
    cli = [sys.executable, "-m", "gguf_provider.cli", "embed"]
    model = str(minilm_path)
    texts = ["A cat sits on the mat.", "A kitten is resting on a rug."]
    out = subprocess.run([*cli, model, *texts], capture_output=True,
                         text=True, timeout=120, check=True).stdout.splitlines()
    a, b = (json.loads(line) for line in out)
    # the vectors the library gives for the same texts (its own server: rounding may differ in the last digits)
    assert len(a) == len(b) == 384
    for got, want in zip((a, b), minilm.embed_documents(texts), strict=True):
        assert _cos(got, want) > 0.999
    doc = json.loads(subprocess.run([*cli, "--json", model], input="one\ntwo\n", capture_output=True, text=True,
                                    timeout=120, check=True).stdout)
    assert doc["dimensions"] == 384 and [d["text"] for d in doc["data"]] == ["one", "two"]
    failed = subprocess.run([*cli, model, LONG], capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and "at most 512" in failed.stderr and "truncate" in failed.stderr
    cut = subprocess.run([*cli, "--truncate", model, LONG], capture_output=True, text=True, timeout=120, check=True)
    assert len(json.loads(cut.stdout)) == 384


def test_rag_notebook_executes(tmp_path: Path) -> None:
    """notebooks/rag.ipynb (LlamaIndex, MiniLM embeddings, Qwen answering) is current and runs: the retriever
    returns one of the passages with its score, and the query engine answers with one as its source (which passage
    is the model's reading, and the answer's words differ between CPUs: neither is pinned)."""
    from tests.support import make_notebook, make_rag_notebook

    fresh = make_notebook.checked_fresh(make_rag_notebook.NOTEBOOK, make_rag_notebook.build(),
                                        "tests/support/make_rag_notebook.py")
    nb = make_notebook.execute(fresh, tmp_path)
    out = ["".join(str(o.get("text", "")) for o in c.outputs) for c in nb.cells if c.cell_type == "code"]
    answer, source = out[2].rsplit("\nsource: ", 1)
    facts = [line.strip()[1:-2] for line in make_rag_notebook.CELLS[1][1].splitlines() if line.startswith('    "')]
    score, passage = out[1].strip().split(" ", 1)
    assert len(facts) == 4 and passage in facts and -1 <= float(score) <= 1, out  # one of them, whichever
    assert answer.strip() and source.strip() in facts, out
