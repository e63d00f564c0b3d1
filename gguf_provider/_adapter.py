"""Small pieces the framework adapters share (pydantic is there whenever an adapter is)."""

from __future__ import annotations

from pydantic import SecretStr

from .engine import env_api_key


def env_api_key_secret() -> SecretStr | None:
    """The ``api_key`` default: ``$GGUF_PROVIDER_API_KEY`` as a secret, or None."""
    key = env_api_key()
    return SecretStr(key) if key else None
