"""What seeding each batch's host augmentation costs: a batch read with its seed (SeededBatch) against the same batch
read as a plain list, side by side, on the CPU.

Host augmentation draws from a seed of its own per batch (trainables.data.SeededBatch), so that a resumed trial's
workers draw what the uninterrupted trial's drew. Reading a batch then seeds torch's, Python's and numpy's generators
once; in the training process (no DataLoader workers) it also saves and restores them. This times both ways of
reading the same batches with the same draws in the training process, round after round alternately, for each host
form, and the seeding alone as a worker pays it. Needs only torch, timm and pydantic.

  python -m benchmarks.bench_seeded_batches             # the table, about a minute on one CPU core
  python -m benchmarks.bench_seeded_batches --quick     # a smoke run of the script itself, measures nothing
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.bench_data import write_fake_cifar10
from trainables.data import SeededBatch, load_dataset
from trainables.data.seeds import _seeded_draws

# (label, load_dataset arguments; "root" is filled in)
FORMS = [
    ("digits basic (a translation, torch)", {"name": "digits", "augment": "basic"}),
    ("cifar10 basic (crop + flip by slicing)", {"name": "cifar10", "augment": "basic", "device_resident": False}),
    ("cifar10 strong (+ RandAugment on PIL)", {"name": "cifar10", "augment": "strong", "device_resident": False}),
]


def _ms_per_batch(train, batches: list[list[int]], seeded: bool) -> float:
    """Milliseconds per batch; both ways make the same draws (the plain list's generators are seeded as its seed
    would seed them, outside the clock), so that only the seeding and restoring differ, not the augmentation's work."""
    spent = 0.0
    for k, positions in enumerate(batches):
        if not seeded:
            torch.default_generator.manual_seed(k), random.seed(k), np.random.seed(k)
        t0 = time.perf_counter()
        train.__getitems__(SeededBatch(positions, k) if seeded else positions)
        spent += time.perf_counter() - t0
    return spent / len(batches) * 1e3


def _seeding_us(repeats: int) -> float:
    """The seeding a worker does per batch (it saves and restores nothing), in microseconds."""
    t0 = time.perf_counter()
    for k in range(repeats):
        torch.default_generator.manual_seed(k)
        random.seed(k)
        np.random.seed(k)
    return (time.perf_counter() - t0) / repeats * 1e6


def _training_process_us(repeats: int, torch_only: bool) -> float:
    """What a batch read in the training process adds, seeding, saving and restoring, in microseconds."""
    t0 = time.perf_counter()
    for k in range(repeats):
        with _seeded_draws(k, torch_only=torch_only):
            pass
    return (time.perf_counter() - t0) / repeats * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--batches", type=int, default=10, help="batches per timing")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks the script only")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.batches, args.rounds = 8, 2, 1
    torch.set_num_threads(1)  # as in a DataLoader worker
    print(f"batch {args.batch}, {args.batches} batches a timing, median of {args.rounds} rounds, one thread")
    print("| form | plain list, ms/batch | seeded, ms/batch | seeded / plain | its rounds' quartiles |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        write_fake_cifar10(Path(root), n_train=max(args.batch * args.batches, 50), n_test=10)
        for label, data in FORMS:
            where = {"root": root} if data["name"] == "cifar10" else {}
            train = load_dataset(data["name"], **where, **{k: v for k, v in data.items() if k != "name"}).train
            rng = np.random.default_rng(0)
            batches = [rng.choice(len(train), args.batch, replace=False).tolist() for _ in range(args.batches)]
            plain, seeded = [], []
            for r in range(args.rounds):  # alternately first, so that neither always runs warm
                for way in (False, True) if r % 2 else (True, False):
                    (seeded if way else plain).append(_ms_per_batch(train, batches, seeded=way))
            ratios = sorted(s / q for s, q in zip(seeded, plain))
            quartiles = f"{ratios[len(ratios) // 4]:.3f}-{ratios[(3 * len(ratios)) // 4]:.3f}"
            print(
                f"| {label} | {statistics.median(plain):.3f} | {statistics.median(seeded):.3f} | "
                f"{statistics.median(ratios):.3f} | {quartiles} |"
            )
    repeats = 200 if args.quick else 20_000
    print(f"a worker's seeding per batch (torch, Python, numpy): {_seeding_us(repeats):.1f} us")
    print(
        "the training process's seeding, saving and restoring per batch: torch's alone "
        f"{_training_process_us(repeats, True):.1f} us, all three {_training_process_us(repeats, False):.1f} us"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
