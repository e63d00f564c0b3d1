"""Repo ids served by the local HF endpoint in the integration tests (see tests/integration_tests/conftest.py)."""

MAIN = "test-org/SmolLM2-135M-Instruct-GGUF"
AUTO = "test-org/SmolLM2-quants-GGUF"  # five real quants of one model: the automatic choice
TRICKY = "test-org/tricky-GGUF"
SPLIT = "test-org/split-GGUF"
ODD = "test-org/odd-quants-GGUF"
FLAKY = "test-org/flaky-GGUF"
BROKEN = "test-org/broken-GGUF"
PRIVATE = "test-org/private-GGUF"
TOKEN = "hf_test_secret_token"
