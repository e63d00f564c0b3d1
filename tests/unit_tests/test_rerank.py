"""Reranking without a server: the `rerank` server option (declared once: flags, identity, the check that the model is
a reranker, read from GGUF headers written here), the requests the engine makes (batches, the pair limit, the
merge of the batches' answers) through an ``httpx.MockTransport`` standing in for llama-server, the adapters'
options and the CLI's parser. The real server and the real seeded reranker: tests/integration_tests/test_rerank.py.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest

import gguf_provider
from gguf_provider import cli
from gguf_provider.engine import RERANK_BATCH, Engine, EngineConfig, RerankResult, best_first
from gguf_provider.errors import APIError, ContextOverflowError, ModelError, NotARerankerError
from gguf_provider.runtime._common import gguf
from gguf_provider.runtime._common.process import Address
from gguf_provider.runtime._install import discovery
from gguf_provider.runtime._install.discovery import ServerCapabilities
from gguf_provider.runtime._serve import server_options
from gguf_provider.runtime._serve.argv import build_argv
from gguf_provider.runtime._serve.server_options import ServerSpec
from tests.support.gguf_tables import write_gguf

CAPS = ServerCapabilities(path="llama-server", version="test", flags={"--rerank": True, "--embedding": True})
BERT = {"general.architecture": "bert", "bert.context_length": 512, "bert.embedding_length": 8,
        "bert.block_count": 1, "bert.attention.head_count": 2}
F32 = 0


def _model(tmp_path: Path, name: str, meta: dict[str, Any], heads: tuple[str, ...] = ()) -> Path:
    tensors = [("token_embd.weight", (8, 16), F32), *((h, (8, 1), F32) for h in heads)]
    return write_gguf(tmp_path / name, meta, tensors)


# --- the server option -------------------------------------------------------------------------------------------


def test_rerank_is_one_declared_option_of_the_identity() -> None:
    option = server_options.BY_NAME["rerank"]
    assert option in server_options.ARGS and option.group is None and option.needs == ("--rerank",)
    assert "--rerank" in discovery.OPTIONAL_FLAGS
    assert EngineConfig(model="m").rerank is False and ServerSpec(model=Path("/m.gguf")).rerank is False


def test_a_reranker_server_is_another_server(tmp_path: Path) -> None:
    model, binary = tmp_path / "m.gguf", tmp_path / "llama-server"
    model.write_bytes(b"GGUF")
    binary.write_bytes(b"#!")
    assert (ServerSpec(model=model, rerank=True).family(binary)
            != ServerSpec(model=model, embedding=True).family(binary)
            != ServerSpec(model=model).family(binary))


def _argv(**spec: Any) -> list[str]:
    return build_argv(ServerSpec(model=Path("/m.gguf"), **spec), Path("/b"), CAPS, "a", 4096,
                      Address(socket="/s"), None)


def test_rerank_argv_is_rerank_with_one_physical_batch_per_pair() -> None:
    argv = _argv(rerank=True)
    assert "--rerank" in argv and "--embedding" not in argv and "--pooling" not in argv
    i = argv.index("--ubatch-size")
    assert argv[i + 1] == "4096" and argv[argv.index("--batch-size") + 1] == "4096"
    # the user's own physical batch stands; --rerank (= --embedding --pooling rank) wins over embedding
    assert "--ubatch-size" not in _argv(rerank=True, server_args=("-ub", "256"))
    both = _argv(rerank=True, embedding=True, pooling="mean")
    assert "--rerank" in both and "--embedding" not in both and "--pooling" not in both
    assert "--rerank" not in _argv() and "--rerank" not in _argv(embedding=True)


def test_the_reranker_engine_never_speculates(tmp_path: Path) -> None:
    from gguf_provider.runtime._serve.config import resolve_spec

    model = _model(tmp_path, "r.gguf", BERT, ("cls.output.weight",))
    spec = resolve_spec(EngineConfig(model_path=str(model), rerank=True))
    assert spec.rerank and spec.speculative == "off"


def test_a_model_without_rank_pooling_or_a_classifier_head_is_refused(tmp_path: Path) -> None:
    chat = _model(tmp_path, "chat.gguf", {"general.architecture": "llama", "llama.context_length": 2048})
    embedder = _model(tmp_path, "emb.gguf", {**BERT, "bert.pooling_type": 1})
    for path, says in ((chat, "names no pooling type"), (embedder, "names pooling type mean, not rank")):
        spec = ServerSpec(model=path, rerank=True)
        with pytest.raises(NotARerankerError, match=says) as info:
            spec.check(CAPS, [gguf.read_header(path)])
        assert info.value.model == path and "docs/reranking.md" in str(info.value)
        spec_plain = ServerSpec(model=path)  # no rerank: nothing checked
        spec_plain.check(CAPS, [gguf.read_header(path)])
    assert issubclass(NotARerankerError, ModelError) and gguf_provider.NotARerankerError is NotARerankerError


@pytest.mark.parametrize("meta,heads", [
    ({**BERT}, ("cls.output.weight", "cls.output.bias")),  # a BERT cross-encoder (our test model, MiniLM-style)
    ({**BERT}, ("cls.weight", "cls.bias")),  # jina-reranker-v1-tiny: a head without cls.output
    ({"general.architecture": "qwen3", "qwen3.pooling_type": 4}, ()),  # Qwen3-Reranker's header
])
def test_a_reranker_passes_the_check(tmp_path: Path, meta: dict[str, Any], heads: tuple[str, ...]) -> None:
    path = _model(tmp_path, "r.gguf", meta, heads)
    assert server_options.is_reranker(gguf.read_header(path), [path])
    ServerSpec(model=path, rerank=True).check(CAPS, [gguf.read_header(path)])


# --- the requests ------------------------------------------------------------------------------------------------


class FakeServer:
    """Answers /props, /tokenize (one token per word) and /v1/rerank (score: a function of the document) as
    llama-server does (results sorted best first), recording each rerank request."""

    def __init__(self, n_ctx: int = 512) -> None:
        self.n_ctx = n_ctx
        self.reranks: list[dict[str, Any]] = []
        self.tokenized: list[str] = []
        self.transport = httpx.MockTransport(self.handle)

    @staticmethod
    def score(doc: str) -> float:
        return (sum(map(ord, doc)) % 97) / 7.0

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/props":
            return httpx.Response(200, json={"default_generation_settings": {"n_ctx": self.n_ctx},
                                             "model_path": "/m/reranker.gguf"})
        body = json.loads(request.content)
        if request.url.path == "/tokenize":
            self.tokenized.append(body["content"])
            return httpx.Response(200, json={"tokens": list(range(len(body["content"].split())))})
        if request.url.path == "/v1/rerank":
            self.reranks.append(body)
            results = [{"index": i, "relevance_score": self.score(d)} for i, d in enumerate(body["documents"])]
            results.sort(key=lambda r: -r["relevance_score"])
            return httpx.Response(200, json={"object": "list", "results": results})
        return httpx.Response(404, json={"error": {"code": 404, "message": "not found"}})


def _engine(server: FakeServer) -> Engine:
    return Engine(EngineConfig(base_url="http://fake", rerank=True), transport=server.transport)


DOCS = [f"document number {i} about {'pandas' if i % 3 else 'cats'}" for i in range(150)]


def _expected(docs: list[str], top_n: int | None = None) -> list[RerankResult]:
    return best_first([RerankResult(i, FakeServer.score(d)) for i, d in enumerate(docs)], top_n)


def test_many_documents_go_in_batches_and_come_back_ranked_together() -> None:
    server = FakeServer()
    got = _engine(server).rerank("what do pandas eat?", DOCS, top_n=10)
    assert [len(r["documents"]) for r in server.reranks] == [RERANK_BATCH, RERANK_BATCH, 150 - 2 * RERANK_BATCH]
    assert all(r["query"] == "what do pandas eat?" and "top_n" not in r for r in server.reranks)
    assert [d for r in server.reranks for d in r["documents"]] == DOCS
    assert got == _expected(DOCS, 10)
    assert server.tokenized == []  # short pairs are not counted


def test_async_rerank_makes_the_same_requests() -> None:
    sync_server, async_server = FakeServer(), FakeServer()
    want = _engine(sync_server).rerank("q", DOCS, batch_size=7)
    got = asyncio.run(_engine(async_server).arerank("q", DOCS, batch_size=7))
    assert got == want == _expected(DOCS) and async_server.reranks == sync_server.reranks
    assert len(async_server.reranks) == 22


def test_no_documents_make_no_request_and_bad_arguments_are_refused() -> None:
    server = FakeServer()
    engine = _engine(server)
    assert engine.rerank("q", []) == [] and asyncio.run(engine.arerank("q", [])) == []
    assert server.reranks == []
    assert engine.rerank("q", ["a", "b"], top_n=0) == []
    for bad in ({"top_n": -1}, {"batch_size": 0}):
        with pytest.raises(ValueError):
            engine.rerank("q", ["a"], **bad)
    with pytest.raises(ValueError, match="list of texts"):
        engine.rerank("q", "one string")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rerank=True"):
        Engine(EngineConfig(model="m")).rerank("q", ["a"])


def test_a_pair_longer_than_the_limit_is_refused_naming_the_document_before_any_rerank() -> None:
    server = FakeServer(n_ctx=64)
    long = "word " * 70
    with pytest.raises(ContextOverflowError, match=r"document 2 to rerank is 70 tokens, 78 with the query") as info:
        _engine(server).rerank("how many words now", ["short", "also short", long])
    assert (info.value.n_prompt_tokens, info.value.n_ctx) == (78, 64)
    assert server.reranks == [] and server.tokenized == ["how many words now", long]
    # counted, and it fits: sent
    fits = "word " * 50
    assert _engine(server).rerank("q", [fits]) == [RerankResult(0, FakeServer.score(fits))]


def test_a_malformed_answer_is_an_api_error() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/props":
            return httpx.Response(200, json={"default_generation_settings": {"n_ctx": 512}})
        return httpx.Response(200, json={"results": [{"index": 0, "relevance_score": 1.0}]})  # one of two

    engine = Engine(EngineConfig(base_url="http://fake", rerank=True), transport=httpx.MockTransport(handle))
    with pytest.raises(APIError, match="1 results for 2 documents"):
        engine.rerank("q", ["a", "b"])


# --- the adapters' options and the CLI ---------------------------------------------------------------------------


def test_the_adapters_declare_top_n_and_batch_size_once_and_forward_unknown_options() -> None:
    from gguf_provider.langchain import GGUFRerank
    from gguf_provider.llama_index import GGUFRerankPostprocessor
    from gguf_provider.options import RerankOptions, UnknownOptionWarning

    for cls, extras in ((GGUFRerank, "model_kwargs"), (GGUFRerankPostprocessor, "additional_kwargs")):
        assert issubclass(cls, RerankOptions)
        assert cls.model_fields["top_n"] is RerankOptions.model_fields["top_n"] or (
            cls.model_fields["top_n"].description == RerankOptions.model_fields["top_n"].description)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            made = cls(model="m.gguf", top_n=2, batch_size=8, temprature=0)
        assert [w.category for w in caught] == [UnknownOptionWarning]
        assert getattr(made, extras) == {"temprature": 0}
        config = made.engine_config()
        assert config.rerank and not config.embedding
        for server_only in ("pooling", "speculative", "chat_template", "rerank"):
            assert server_only not in cls.model_fields
        with pytest.raises(ValueError):
            cls(model="m.gguf", top_n=-1)
    assert gguf_provider.GGUFRerank is GGUFRerank
    assert gguf_provider.GGUFRerankPostprocessor is GGUFRerankPostprocessor


def test_the_adapters_rerank_through_the_engine() -> None:
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, TextNode

    from gguf_provider.langchain import GGUFRerank
    from gguf_provider.llama_index import GGUFRerankPostprocessor

    docs = DOCS[:20]
    want = _expected(docs, 4)
    lc = GGUFRerank(base_url="http://fake", transport=FakeServer().transport, top_n=4)
    given = [Document(page_content=d, metadata={"n": i}) for i, d in enumerate(docs)]
    for out in (lc.compress_documents(given, "q"), asyncio.run(lc.acompress_documents(given, "q"))):
        assert [(d.metadata["n"], d.metadata["relevance_score"]) for d in out] == [(r.index, r.score) for r in want]
    assert "relevance_score" not in given[0].metadata  # the input documents are left as they were
    li = GGUFRerankPostprocessor(base_url="http://fake", transport=FakeServer().transport, top_n=4)
    nodes = [NodeWithScore(node=TextNode(text=d, id_=str(i)), score=0.5) for i, d in enumerate(docs)]
    for out_nodes in (li.postprocess_nodes(nodes, query_str="q"),
                      asyncio.run(li.apostprocess_nodes(nodes, query_str="q"))):
        assert [(int(n.node.node_id), n.score) for n in out_nodes] == [(r.index, r.score) for r in want]
    with pytest.raises(ValueError, match="needs the query"):
        li.postprocess_nodes(nodes)


def test_the_cli_rerank_command_parses() -> None:
    args = cli.build_parser().parse_args(["rerank", "model.gguf", "the query", "doc a", "doc b", "--top-n", "1",
                                          "--json"])
    assert (args.spec, args.query, args.document, args.top_n, args.json) == (
        "model.gguf", "the query", ["doc a", "doc b"], 1, True)
    assert args.func is cli.cmd_rerank


def test_the_test_rerankers_head_is_the_same_bytes_everywhere(tmp_path: Path) -> None:
    """scripts/make_reranker.py's seeded head (numpy's frozen RandomState stream, written as safetensors by hand):
    the bytes the converter reads, pinned, so the GGUF's recorded sha256 holds on a clean machine."""
    from scripts import make_reranker
    from scripts.model_files import sha256_file

    head = make_reranker.head_tensors()
    assert {k: v.shape for k, v in head.items()} == {"classifier.weight": (1, 384), "classifier.bias": (1,)}
    make_reranker.write_safetensors(tmp_path / "a.safetensors", head)
    assert sha256_file(tmp_path / "a.safetensors") == (
        "900353e4e0e2793433248e67803df1d3ab1c07cfe074a82ddf3fda44a5b17193")
