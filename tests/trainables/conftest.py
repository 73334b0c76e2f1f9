"""Fixtures of the trainables tests: fake datasets on disk in their official layouts."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest


def write_fake_cifar_tree(root: Path, name: str = "cifar10", per_batch: int = 4, n_test: int = 6, seed: int = 0) -> dict:
    """Write a tiny CIFAR tree in the official python-pickle format (Python 2 style bytes keys).

    Returns the arrays written: train/test data (N, 3072) uint8 and labels, in file order.
    """
    rng = np.random.default_rng(seed)
    num_classes = 10 if name == "cifar10" else 100
    folder = root / ("cifar-10-batches-py" if name == "cifar10" else "cifar-100-python")
    folder.mkdir(parents=True, exist_ok=True)
    label_key = b"labels" if name == "cifar10" else b"fine_labels"
    train_files = [f"data_batch_{i}" for i in range(1, 6)] if name == "cifar10" else ["train"]
    test_file = "test_batch" if name == "cifar10" else "test"
    meta_file, names_key = ("batches.meta", b"label_names") if name == "cifar10" else ("meta", b"fine_label_names")

    def dump(path: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = rng.integers(0, num_classes, size=n)
        batch = {b"batch_label": b"fake", label_key: labels.tolist(), b"data": data, b"filenames": [b"x.png"] * n}
        if name == "cifar100":
            batch[b"coarse_labels"] = (labels // 5).tolist()
        path.write_bytes(pickle.dumps(batch, protocol=2))
        return data, labels

    n_train = per_batch * 5 if name == "cifar10" else per_batch
    parts = [dump(folder / f, n_train // len(train_files)) for f in train_files]
    test = dump(folder / test_file, n_test)
    names = [f"class_{i}".encode() for i in range(num_classes)]
    (folder / meta_file).write_bytes(pickle.dumps({names_key: names}, protocol=2))
    return {
        "folder": folder,
        "train_data": np.concatenate([p[0] for p in parts]),
        "train_labels": np.concatenate([p[1] for p in parts]),
        "test_data": test[0],
        "test_labels": test[1],
    }


@pytest.fixture
def write_fake_cifar():
    """`write_fake_cifar(root, name="cifar10", per_batch=4, n_test=6, seed=0)`: see write_fake_cifar_tree."""
    return write_fake_cifar_tree


@pytest.fixture
def fake_cifar10(tmp_path: Path) -> dict:
    return write_fake_cifar_tree(tmp_path, "cifar10")
