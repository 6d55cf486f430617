"""Shared fixtures: offline settings and tiny models built in-process (no network)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from trl_multiturn.testing import build_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_chatml_model(tmp_path_factory):
    """Path to a tiny random Llama-style model with Qwen2.5's ChatML template."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-chatml"), template="chatml")


@pytest.fixture(scope="session")
def tiny_llama3_model(tmp_path_factory):
    """Path to a tiny random model with the Llama-3 chat template."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama3"), template="llama3")


@pytest.fixture(params=["chatml", "llama3"])
def tiny_model(request, tiny_chatml_model, tiny_llama3_model):
    """Both chat-template families, for tests that must hold on each."""
    return {"chatml": tiny_chatml_model, "llama3": tiny_llama3_model}[request.param]
