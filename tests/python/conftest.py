"""Fixtures for the Python package tests: the built binary, the golden tiny checkpoint, its inputs."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# The package from the source tree (CTest also sets PYTHONPATH; this covers a plain `pytest tests/python`).
sys.path.insert(0, os.path.join(REPO, "python"))

TINY = os.path.join(REPO, "tests", "data", "tiny-a")


@pytest.fixture(scope="session")
def binary():
    path = os.environ.get("DS4REPLAY_BIN") or os.path.join(REPO, "build", "ds4replay")
    if not os.access(path, os.X_OK):
        pytest.skip("ds4replay binary not built (%s)" % path)
    os.environ["DS4REPLAY_BIN"] = path
    return path


@pytest.fixture(scope="session")
def model():
    return os.path.join(TINY, "model")


@pytest.fixture(scope="session")
def token_seqs():
    """The golden inputs' token lists (tests/data/tiny-a/tokens.jsonl), first 6."""
    with open(os.path.join(TINY, "tokens.jsonl")) as f:
        return [json.loads(l)["tokens"] for l in f][:6]


@pytest.fixture(scope="session")
def has_encode(binary):
    """True when the binary has the `encode` command (issue 15 part 1)."""
    r = subprocess.run([binary, "--help"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return any(line.split()[:1] == ["encode"] for line in r.stdout.splitlines())
