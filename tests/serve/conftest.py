"""The serve tests' model: the tiny de→en model, trained once a run (tests/conftest.py's `trained_tiny`)."""

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def checkpoint(trained_tiny) -> Path:
    return trained_tiny(200)
