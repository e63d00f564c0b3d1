"""The prompt cache's pure parts (runtime/_serve/prompt_cache.py): sizes, the slot file's tokens, keying, sidecar checks,
the LRU disk bound, the choice of a saved prompt, and the option's place in the command line and the identity.
tests/integration_tests/test_prompt_cache.py runs it against real servers."""

from __future__ import annotations

import json
import os
import struct
import time
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest

from gguf_provider.errors import PromptCacheWarning
from gguf_provider.runtime._common.process import Address
from gguf_provider.runtime._install.discovery import ServerCapabilities
from gguf_provider.runtime._serve import prompt_cache as pc
from gguf_provider.runtime._serve import registry, server_options
from gguf_provider.runtime._serve.argv import build_argv
from gguf_provider.runtime._serve.server_options import ServerSpec


def slot_file(path: Path, tokens: list[int], *, packed: bool = True, state: bytes = b"\0" * 64,
              media: int = 0) -> Path:
    """A file laid out as llama_state_seq_save_file writes it, holding llama-server's packed tokens."""
    body = [pc.TOKEN_NULL, 1, len(tokens), *tokens, media] if packed else list(tokens)
    path.write_bytes(struct.pack("<III", pc.STATE_MAGIC, pc.STATE_VERSION, len(body))
                     + struct.pack(f"<{len(body)}i", *body) + state)
    return path


def saved(directory: Path, tokens: list[int], *, model: Path, build: str = "b1", mtime: float | None = None,
          size: int = 64) -> pc.Saved:
    sha = pc.tokens_hash(tokens)
    path = slot_file(directory / f"{sha[:32]}.bin", tokens, state=b"\0" * size)
    rec = pc.Saved(path=path, n_tokens=len(tokens), tokens_sha256=sha, identity=directory.name,
                   model=pc.file_id(model), build=build, bytes=path.stat().st_size, crc32=pc.checksum(path),
                   saved_at=time.time())
    rec.sidecar.write_text(json.dumps(rec.to_json()))
    if mtime is not None:
        os.utime(rec.path, (mtime, mtime))
    return rec


@pytest.fixture
def model(tmp_path: Path) -> Path:
    m = tmp_path / "m.gguf"
    m.write_bytes(b"GGUF model")
    return m


@pytest.mark.parametrize("text,want", [("0", 0), ("2G", 2 << 30), ("500M", 500 << 20), ("1.5GiB", 3 << 29),
                                       ("100", 100), (" 64 kb ", 64 << 10), ("1T", 1 << 40)])
def test_sizes(text: str, want: int) -> None:
    assert pc.parse_size(text) == want


def test_a_wrong_size_warns_and_keeps_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pc.ENV, "lots")
    with pytest.warns(PromptCacheWarning, match="not a size"):
        assert pc.limit() == pc.parse_size(pc.DEFAULT_SIZE)
    monkeypatch.setenv(pc.ENV, "0")
    assert pc.limit() == 0
    monkeypatch.delenv(pc.ENV)
    assert pc.limit() == 2 << 30


def test_the_tokens_of_a_slot_file(tmp_path: Path) -> None:
    tokens = list(range(1000, 1300))
    assert pc.read_tokens(slot_file(tmp_path / "a.bin", tokens)) == tokens
    assert pc.read_tokens(slot_file(tmp_path / "b.bin", tokens, packed=False)) == tokens  # older builds
    assert pc.read_tokens(slot_file(tmp_path / "c.bin", tokens, media=1)) is None  # media chunks: not ours
    (tmp_path / "d.bin").write_bytes(b"ggsq but not really")
    assert pc.read_tokens(tmp_path / "d.bin") is None
    short = slot_file(tmp_path / "e.bin", tokens, state=b"")
    short.write_bytes(short.read_bytes()[:100])  # cut inside the tokens
    assert pc.read_tokens(short) is None
    assert pc.read_tokens(tmp_path / "missing.bin") is None


def test_keys_are_the_tokens_and_differ_by_one_token() -> None:
    a, b = list(range(300)), [*range(299), 7]
    assert pc.tokens_hash(a) == pc.tokens_hash(list(a)) != pc.tokens_hash(b)
    assert pc.common_prefix(a, b) == 299 and pc.common_prefix(a, a[:10]) == 10 and pc.common_prefix([], a) == 0


def test_sidecar_checks(tmp_path: Path, model: Path) -> None:
    d = tmp_path / "ident0123"
    d.mkdir()
    rec = saved(d, list(range(300)), model=model)
    loaded = pc.Saved.load(rec.sidecar)
    assert loaded == rec
    mid = pc.file_id(model)
    assert rec.mismatch(identity=d.name, model=mid, build="b1") is None
    assert "identity" in (rec.mismatch(identity="other", model=mid, build="b1") or "")
    assert "build" in (rec.mismatch(identity=d.name, model=mid, build="b2") or "") or \
        "llama-server" in (rec.mismatch(identity=d.name, model=mid, build="b2") or "")
    assert "model" in (rec.mismatch(identity=d.name, model=[*mid[:2], 1], build="b1") or "")
    rec.sidecar.write_text("{not json")
    assert pc.Saved.load(rec.sidecar) is None
    rec.sidecar.write_text(json.dumps({**rec.to_json(), "version": 99}))
    assert pc.Saved.load(rec.sidecar) is None


def test_trim_deletes_least_recently_used_first_and_leftovers(tmp_path: Path, model: Path) -> None:
    now = time.time()
    d1, d2 = tmp_path / "a", tmp_path / "b"
    d1.mkdir()
    d2.mkdir()
    old = saved(d1, list(range(300)), model=model, mtime=now - 300, size=1000)
    mid = saved(d2, list(range(1, 301)), model=model, mtime=now - 200, size=1000)
    new = saved(d1, list(range(2, 302)), model=model, mtime=now - 100, size=1000)
    orphan = slot_file(d2 / "orphan.bin", [1, 2, 3])
    os.utime(orphan, (now - 3600, now - 3600))
    fresh_orphan = slot_file(d2 / "fresh.bin", [1, 2, 3])  # a save in flight: its sidecar comes last
    lone_side = d2 / "lone.json"
    lone_side.write_text("{}")
    one = old.path.stat().st_size + old.sidecar.stat().st_size
    assert pc.trim(10 * one, base=tmp_path, now=now) == []
    assert not orphan.exists() and not lone_side.exists() and fresh_orphan.exists()
    pc.touch(old.path)  # used now: the LRU order is old < new, so mid goes first, then new
    # Sidecars differ by a byte or two (their times): limits with room to spare.
    assert pc.trim(int(2.5 * one), base=tmp_path, now=now + 1) == [mid.path]
    assert pc.trim(int(1.5 * one), base=tmp_path, now=now + 1) == [new.path]
    assert old.path.exists() and old.sidecar.exists() and not new.sidecar.exists()
    assert pc.trim(0, base=tmp_path, now=now + 1) == [old.path]
    assert d1.exists()  # empty, but changed just now: it may be a starting server's (CI: "not a directory")
    assert pc.trim(0, base=tmp_path, now=time.time() + pc.STALE_TMP + 1) == []
    assert not d1.exists()  # an empty directory untouched for longer goes


def test_a_directory_handed_to_a_server_outlives_another_process_trim(tmp_path: Path, monkeypatch: Any) -> None:
    """Seen in CI: a server's --slot-save-path removed as empty by another process's trim() between server_dir()
    and the spawn; llama-server refused to start ("not a directory")."""
    monkeypatch.setattr(pc, "root", lambda: tmp_path)
    old = tmp_path / "old"
    old.mkdir()
    os.utime(old, (time.time() - 2 * pc.STALE_TMP,) * 2)
    d = pc.server_dir("ident")
    os.utime(d, (time.time() - 2 * pc.STALE_TMP,) * 2)
    d = pc.server_dir("ident")  # handed out again: touched
    pc.trim(0)
    assert d.is_dir() and not old.exists()


def test_choose_the_longest_shared_prefix_above_the_threshold(tmp_path: Path, model: Path) -> None:
    d = tmp_path / "ident"
    d.mkdir()
    system = list(range(5000, 5400))
    a = saved(d, [*system, 1, 2, 3], model=model)
    b = saved(d, [*system[:300], 9, 9], model=model)
    cache = pc.ServerCache(d, model=str(model), build="b1")
    found = cache.pending()
    assert sorted(s.path for s in found) == sorted([a.path, b.path])
    match = cache.choose([*system, 7, 7], found)
    assert match is not None and match.saved.path == a.path and match.common == 400
    again = cache.choose([*system, 7, 7], found)  # each file once per server: the next best
    assert again is not None and again.saved.path == b.path and again.common == 300
    assert cache.choose(system, found) is None
    assert pc.ServerCache(d, model=str(model), build="b1").choose(system[:200], found) is None  # below MIN_TOKENS


def test_a_mismatched_or_corrupt_file_is_discarded_with_a_warning(tmp_path: Path, model: Path) -> None:
    d = tmp_path / "ident"
    d.mkdir()
    other_build = saved(d, list(range(400)), model=model, build="other")
    corrupt = saved(d, list(range(1, 401)), model=model)
    slot_file(corrupt.path, list(range(2, 402)))  # the same size, other bytes
    cut = saved(d, list(range(5, 405)), model=model)
    cut.path.write_bytes(cut.path.read_bytes()[:-10])
    forged = saved(d, list(range(6, 406)), model=model)
    slot_file(forged.path, list(range(7, 407)))  # other tokens, its sidecar's size and checksum made to agree
    forged.sidecar.write_text(json.dumps({**forged.to_json(), "crc32": pc.checksum(forged.path)}))
    cache = pc.ServerCache(d, model=str(model), build="b1")
    with pytest.warns(PromptCacheWarning) as seen:
        assert cache.choose(list(range(400)), cache.pending()) is None
    said = " ".join(str(w.message) for w in seen)
    assert "discarded" in said and "llama-server 'other'" in said and "checksum does not match" in said
    assert "its size is" in said and "tokens do not match" in said
    for gone in (other_build, corrupt, cut, forged):
        assert not gone.path.exists() and not gone.sidecar.exists()
    ok = saved(d, list(range(3, 403)), model=model)
    match = cache.choose(list(range(3, 450)), cache.pending())
    assert match is not None
    with pytest.warns(PromptCacheWarning, match="refused it: no space"):
        assert cache.restored(match, {"error": "no space"}) is False
    assert not ok.path.exists()


def test_only_the_first_requests_look(tmp_path: Path, model: Path) -> None:
    d = tmp_path / "ident"
    d.mkdir()
    saved(d, list(range(400)), model=model)
    cache = pc.ServerCache(d, model=str(model), build="b1", first_requests=2)
    assert cache.pending() and cache.pending() and cache.pending() == []


def test_a_server_with_nothing_saved_looks_once(tmp_path: Path, model: Path) -> None:
    """Nothing saved at its first request: the next ones do not list the directory again (each listing is a thread
    hop on a gateway's path to the first token), even if a save appears meanwhile."""
    d = tmp_path / "ident"
    d.mkdir()
    cache = pc.ServerCache(d, model=str(model), build="b1")
    assert cache.pending() == [] and cache.left == 0
    saved(d, list(range(400)), model=model)
    assert cache.pending() == []
    assert pc.ServerCache(d, model=str(model), build="b1").pending()  # the next server finds it


def test_free_slot() -> None:
    slots: list[dict[str, Any]] = [{"id": 0, "is_processing": True}, {"id": 1, "n_prompt_tokens": 50},
                                   {"id": 2}, {"id": 3, "n_prompt_tokens": 9}]
    assert pc.free_slot(slots) == 2  # idle and empty
    assert pc.free_slot(slots[:2]) is None  # slot 1 holds a prompt of the server's own
    assert pc.free_slot(slots[:1]) is None and pc.free_slot({"error": 1}) is None


def test_where_it_cannot_work() -> None:
    assert pc.why_off(supported=True, mmproj=False, draft=False) is None
    assert "slot-save-path" in (pc.why_off(supported=False, mmproj=False, draft=False) or "")
    assert "draft" in (pc.why_off(supported=True, mmproj=False, draft=True) or "")
    assert "images" in (pc.why_off(supported=True, mmproj=True, draft=False) or "")


def test_the_option_is_a_flag_and_no_part_of_the_identity(tmp_path: Path, model: Path) -> None:
    binary = tmp_path / "llama-server"
    binary.write_bytes(b"#!")
    caps = ServerCapabilities(path=str(binary), version="t", flags={"--slot-save-path": True})
    on, off = ServerSpec(model=model), ServerSpec(model=model, prompt_cache=False)
    assert on.identity(binary) == off.identity(binary) and on.family(binary) == off.family(binary)
    assert server_options.BY_NAME["prompt_cache"].identity is None
    argv = build_argv(on, binary, caps, "a", 512, Address(socket="/x.sock"), None, slot_save_path=tmp_path)
    assert argv[argv.index("--slot-save-path") + 1] == str(tmp_path)
    assert "--slot-save-path" not in build_argv(off, binary, caps, "a", 512, Address(socket="/x.sock"), None,
                                                slot_save_path=tmp_path)
    assert "--slot-save-path" not in build_argv(on, binary, caps, "a", 512, Address(socket="/x.sock"), None)


def test_the_registry_keeps_the_directory() -> None:
    entry = registry.Entry(pid=1, create_time=2.0, alias="x", socket="/s", prompt_cache="/cache/dir")
    again = registry.Entry.from_json(entry.to_json())
    assert again is not None and again.prompt_cache == "/cache/dir"
    older = {k: v for k, v in entry.to_json().items() if k != "prompt_cache"}
    assert (registry.Entry.from_json(older) or entry).prompt_cache == ""


# httpcore's Unix-socket connect leaves its socket open when the connect fails (httpcore/_backends/sync.py,
# connect_unix_socket): its ResourceWarning comes when the socket is collected, inside this block.
@pytest.mark.filterwarnings("default::ResourceWarning")
def test_saving_a_server_that_does_not_answer_warns_and_returns(tmp_path: Path, model: Path) -> None:
    d = tmp_path / "ident"
    d.mkdir()
    t0 = time.monotonic()  # httpx, which prompt_cache imports at first use, is imported above: not timed here
    with pytest.warns(PromptCacheWarning, match="not saved.*stopping it anyway"):
        assert pc.save_slots(Address(socket=str(tmp_path / "none.sock")), d, model=str(model)) == []
    # A refused connection fails at once (~1 ms), not at the end of the budget: our SAVE_BUDGET, >1000x.
    assert time.monotonic() - t0 < pc.SAVE_BUDGET


# --- the save's limits, against a fake llama-server and a fake clock ---------------------------------------------


class Clock:
    """``time`` as prompt_cache reads it: a monotonic clock that moves only when a save says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return time.time()


class FakeServer:
    """llama-server's ``/slots``, ``/props`` and ``/slots/{id}?action=save`` over an injected transport. Each save
    writes a slot file of the slot's tokens (distinct per slot), records the read timeout it was given, and moves
    the clock on by ``save_s``; ``fail_at``: the save (by count, from 0) that times out instead."""

    def __init__(self, directory: Path, slots: list[dict[str, Any]], clock: Clock, save_s: float = 0.0,
                 fail_at: int | None = None) -> None:
        self.directory, self.slots, self.clock, self.save_s, self.fail_at = directory, slots, clock, save_s, fail_at
        self.saves: list[tuple[int, float]] = []  # (slot id, the request's read timeout)

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "GET" and path == "/slots":
            return httpx.Response(200, json=self.slots)
        if request.method == "GET" and path == "/props":
            return httpx.Response(200, json={"build_info": "b1"})
        assert request.method == "POST" and request.url.params["action"] == "save", request
        slot = int(path.rsplit("/", 1)[1])
        self.saves.append((slot, request.extensions["timeout"]["read"]))
        if len(self.saves) - 1 == self.fail_at:
            raise httpx.ReadTimeout("timed out", request=request)
        n = next(s["n_prompt_tokens"] for s in self.slots if s["id"] == slot)
        slot_file(self.directory / json.loads(request.content)["filename"], list(range(slot * 10000, slot * 10000 + n)))
        self.clock.now += self.save_s
        return httpx.Response(200, json={"id_slot": slot, "n_saved": n})

    def address(self) -> Address:
        return Address(url="http://llama-server", injected=httpx.MockTransport(self.handle))


@pytest.fixture
def saving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Clock]:
    """The server's directory, a private home (the trim after a save looks there), the cache on, a fake clock."""
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(pc.ENV, raising=False)
    clock = Clock()
    monkeypatch.setattr(pc, "time", clock)
    return pc.server_dir("ident"), clock


def _slot(i: int, n: int, busy: bool = False) -> dict[str, Any]:
    return {"id": i, "n_ctx": 4096, "is_processing": busy, "n_prompt_tokens": n}


def test_saving_keeps_the_floor_skips_busy_slots_and_goes_longest_first(saving: tuple[Path, Clock],
                                                                        model: Path) -> None:
    d, clock = saving
    server = FakeServer(d, [_slot(0, 300), _slot(1, pc.MIN_TOKENS - 1), _slot(2, pc.MIN_TOKENS),
                            _slot(3, 900, busy=True), _slot(4, 600), _slot(5, 0)], clock)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PromptCacheWarning)
        saved_ = pc.save_slots(server.address(), d, model=str(model))
    assert [slot for slot, _ in server.saves] == [4, 0, 2]  # longest first; the floor is inclusive
    assert [s.n_tokens for s in saved_] == [600, 300, pc.MIN_TOKENS]
    assert sorted(p.name for p in d.iterdir()) == sorted(n for s in saved_ for n in (s.path.name, s.sidecar.name))
    assert all(s.path.stat().st_size == s.bytes and pc.Saved.load(s.sidecar) == s for s in saved_)


def test_saving_stops_at_its_budget_and_warns_what_it_skipped(saving: tuple[Path, Clock], model: Path) -> None:
    """Each save may take what is left of SAVE_BUDGET (its request's timeout); once it is spent, the shorter slots
    are skipped with a warning that counts them."""
    d, clock = saving
    budget = pc.SAVE_BUDGET
    server = FakeServer(d, [_slot(i, 300 + 100 * i) for i in range(5)], clock, save_s=budget / 2.5)
    with pytest.warns(PromptCacheWarning, match=rf"saving took its {budget:.0f} s bound; 2 slot\(s\) of m.gguf "
                                                r"not saved"):
        saved_ = pc.save_slots(server.address(), d, model=str(model))
    assert [s.n_tokens for s in saved_] == [700, 600, 500]
    assert [slot for slot, _ in server.saves] == [4, 3, 2]
    assert [t for _, t in server.saves] == pytest.approx([budget, 0.6 * budget, 0.2 * budget])
    assert len(list(d.glob("*.bin"))) == 3


def test_a_save_cut_by_its_timeout_keeps_the_earlier_ones_and_leaves_no_part(saving: tuple[Path, Clock],
                                                                             model: Path) -> None:
    d, clock = saving
    server = FakeServer(d, [_slot(0, 400), _slot(1, 500), _slot(2, 300)], clock, fail_at=1)
    with pytest.warns(PromptCacheWarning, match="not saved \\(ReadTimeout: timed out\\); stopping it anyway"):
        saved_ = pc.save_slots(server.address(), d, model=str(model))
    assert [s.n_tokens for s in saved_] == [500] and [slot for slot, _ in server.saves] == [1, 0]
    assert sorted(p.name for p in d.iterdir()) == sorted([saved_[0].path.name, saved_[0].sidecar.name])


def test_nothing_is_saved_with_the_cache_off(saving: tuple[Path, Clock], model: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    d, clock = saving
    monkeypatch.setenv(pc.ENV, "0")
    server = FakeServer(d, [_slot(0, 400)], clock)
    assert pc.save_slots(server.address(), d, model=str(model)) == [] and server.saves == []


def test_a_directory_trimmed_while_empty_is_made_again_for_the_save(saving: tuple[Path, Clock], model: Path) -> None:
    """A server that ran long with nothing saved may find its directory gone (another process's trim()): the save
    makes it again, 0700, rather than losing the prompts."""
    d, clock = saving
    server = FakeServer(d, [_slot(0, 400)], clock)
    d.rmdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PromptCacheWarning)
        saved_ = pc.save_slots(server.address(), d, model=str(model))
    assert [s.n_tokens for s in saved_] == [400] and d.stat().st_mode & 0o777 == 0o700
