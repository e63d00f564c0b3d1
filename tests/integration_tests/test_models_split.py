"""resolve_model() on a real split set made by llama-gguf-split (the shard names the tool writes, not ours)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gguf_provider.errors import MissingShardError
from gguf_provider.runtime._models import resolve_model
from tests.support.hf_endpoint import FixtureFiles


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty gguf-provider home; the real files stay where they are."""
    h = tmp_path / "home"
    (h / "models").mkdir(parents=True)
    monkeypatch.setenv("GGUF_PROVIDER_HOME", str(h))
    monkeypatch.delenv("GGUF_PROVIDER_MODELS", raising=False)
    return h


def _link(target: Path, at: Path) -> Path:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(target)
    return at


def test_split_set_complete(home: Path, tmp_path: Path, files: FixtureFiles) -> None:
    assert len(files.split) >= 3
    links = [_link(p, tmp_path / "s" / p.name) for p in files.split]
    for given in (links[0], links[1]):  # any shard stands for the whole set
        m = resolve_model(str(given))
        assert m.path == links[0] and m.shards == tuple(links)
        assert m.size_bytes == sum(p.stat().st_size for p in files.split)


def test_split_set_missing_shard(home: Path, tmp_path: Path, files: FixtureFiles) -> None:
    split = files.split
    _link(split[0], tmp_path / "s" / split[0].name)
    _link(split[2], tmp_path / "s" / split[2].name)
    with pytest.raises(MissingShardError) as err:
        resolve_model(str(tmp_path / "s" / split[0].name))
    assert split[1].name in str(err.value) and split[2].name not in str(err.value)
