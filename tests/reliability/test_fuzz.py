"""Fuzzing (issue 8) of the GGUF header reader on the real SmolLM2 header: random, truncated and mutated, it raises
only GGUFFormatError, never hangs and never allocates absurd memory (the guard of
tests/unit_tests/test_fuzz_offline.py, which fuzzes the SSE parser, the tool-call healer and the event processor
offline).

Counts and worst cases per target fuzzed in this process (this file's, and the offline ones' when they run in the
same pytest run) are written to ``<home>/reports/reliability-fuzz.json`` (docs/reliability.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gguf_provider.errors import GGUFFormatError
from gguf_provider.runtime._common.gguf import read_header
from tests.reliability.report import write_report
from tests.unit_tests import test_fuzz_offline as offline


@pytest.fixture(scope="module", autouse=True)
def _guard_and_report(request: pytest.FixtureRequest) -> Iterator[None]:
    t0 = time.perf_counter()
    failed0 = request.session.testsfailed
    with offline.guarded():
        yield
    targets = {name: {"inputs": offline.INPUTS[name], "documented_exceptions": offline.RAISED[name],
                      "max_call_ms": round(offline.SLOWEST.get(name, 0.0) * 1000, 2),
                      "max_peak_kib": round(offline.PEAK.get(name, 0) / 1024, 1)} for name in sorted(offline.INPUTS)}
    write_report("fuzz", {"targets": targets, "inputs_total": sum(offline.INPUTS.values()),
                          "failed_tests": request.session.testsfailed - failed0,
                          "limits": {"hang_s": offline.HANG_S, "call_s": offline.CALL_S,
                                     "peak_mib": offline.PEAK_BYTES / 2**20, "max_examples": offline.EXAMPLES},
                          "wall_s": round(time.perf_counter() - t0, 1)})


@pytest.fixture(scope="module")
def real_prefix(smollm2_path: Path) -> bytes:
    end = read_header(smollm2_path).metadata_end
    with open(smollm2_path, "rb") as f:
        return f.read(end)


@pytest.fixture(scope="module")
def fuzz_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "f.gguf"


@settings(max_examples=offline.EXAMPLES // 2, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzz_gguf_header(fuzz_file: Path, real_prefix: bytes, data: st.DataObject) -> None:
    """Random bytes, and the real SmolLM2 header truncated and with lengths/types overwritten (absurd sizes)."""
    if data.draw(st.booleans(), label="random"):
        buf = bytearray(data.draw(st.binary(max_size=512).map(lambda b: b"GGUF\x03\0\0\0" + b) | st.binary(max_size=64)))
    else:
        buf = bytearray(real_prefix[: data.draw(st.integers(0, len(real_prefix)), label="cut")])
        for _ in range(data.draw(st.integers(0, 6), label="mutations")):
            if not buf:
                break
            pos = data.draw(st.integers(0, min(len(buf), 4096) - 1), label="pos")
            chunk = data.draw(st.sampled_from([b"\xff" * 8, b"\x7f\xff\xff\xff\xff\xff\xff\xff", b"\0" * 8])
                              | st.binary(min_size=1, max_size=8), label="bytes")
            buf[pos: pos + len(chunk)] = chunk
    fuzz_file.write_bytes(bytes(buf))
    result = offline.call("runtime.gguf.read_header: random/truncated/mutated", read_header,
                          fuzz_file, allowed=(GGUFFormatError,))
    assert not isinstance(result, BaseException) or isinstance(result, GGUFFormatError)
