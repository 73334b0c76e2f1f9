"""Fixtures of the trainables tests: a fake CIFAR-10 tree in the official layout, in the test's directory."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def fake_cifar10(tmp_path: Path, write_fake_cifar) -> dict:
    return write_fake_cifar(tmp_path, "cifar10")
