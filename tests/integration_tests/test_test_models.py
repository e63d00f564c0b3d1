"""The test-model tooling's projector writer (scripts/make_projector.py), without a server.

Here rather than in tests/unit_tests: the writer needs the ``gguf`` package of the llama.cpp source tree
(``llama_src``), which an offline unit run does not have.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gguf_provider.runtime._models import resolve_model
from gguf_provider.runtime._models.local import list_models_dirs
from scripts import make_projector
from scripts.model_files import is_verified, sha256_file


@pytest.fixture
def gguf_py(llama_src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(make_projector, "gguf_py_dir", lambda: llama_src / "gguf-py")


@pytest.mark.usefixtures("gguf_py")
def test_the_projector_is_byte_deterministic_and_reads_back(tmp_path: Path) -> None:
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    make_projector.write(a)
    make_projector.write(b)
    assert a.read_bytes() == b.read_bytes()
    assert sha256_file(a) == make_projector.SHA256
    make_projector.check(a)  # keys, tensor names, shapes and types as read by gguf.GGUFReader


@pytest.mark.usefixtures("gguf_py")
def test_check_refuses_a_different_projector(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    odd = tmp_path / "odd.gguf"
    with monkeypatch.context() as m:
        m.setitem(make_projector.KEYS, "clip.vision.projection_dim", 960)
        m.setitem(make_projector.TENSORS, "mm.input_projection.weight", ((960, 32), "normal"))
        make_projector.write(odd)
    with pytest.raises(RuntimeError, match=r"projection_dim = 960.*mm.input_projection.weight: F32 \[960, 32\]"):
        make_projector.check(odd)


@pytest.mark.usefixtures("gguf_py")
def test_ensure_puts_it_where_vision_finds_it_beside_smollm2(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GGUF_PROVIDER_MODELS", raising=False)
    proj = make_projector.ensure()
    assert proj == tmp_path / "home" / "models" / make_projector.FILENAME
    assert is_verified(proj, make_projector.SHA256)
    assert make_projector.ensure() == proj  # warm: the marker holds
    model = proj.with_name("SmolLM2-135M-Instruct.Q4_1.gguf")
    model.write_bytes(b"GGUF")  # resolving by path reads no header
    (proj.parent / "all-MiniLM-L6-v2.Q8_0.gguf").write_bytes(b"GGUF")
    assert resolve_model(str(model), vision=True).mmproj == proj
    assert resolve_model("SmolLM2-135M-Instruct", vision=True).mmproj == proj
    assert sorted(m.name for m in list_models_dirs()) == ["SmolLM2-135M-Instruct.Q4_1", "all-MiniLM-L6-v2.Q8_0"]
    assert sorted(p.name for p in proj.parent.iterdir()) == [
        "SmolLM2-135M-Instruct.Q4_1.gguf", "all-MiniLM-L6-v2.Q8_0.gguf", make_projector.FILENAME,
        make_projector.FILENAME + ".sha256",
    ]  # no temp dir left behind
