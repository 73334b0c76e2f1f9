"""benchmarks/bench_device_augment.py --quick on CPU: every recipe gets its counts and times, each seed its bytes."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_run_prints_each_measure_for_each_recipe(capsys):
    from benchmarks import bench_device_augment as bench

    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    rows = [ln.split(" | ") for ln in out.splitlines() if ln.startswith(("| basic", "| strong"))]
    measures = [*bench.LABELS.values(), "ms (cpu), median", "ms (cpu), fastest"]
    assert [(r[0], r[2]) for r in rows] == [(f"| {recipe}", m) for recipe in ("basic", "strong") for m in measures]
    counts = {(r[0], r[2]): float(r[3].rstrip(" |")) for r in rows}
    # The batch's few host-to-device copies: one for the crops' rois, one for RandAugment's draws (and the flips');
    # commit 39f8b88's code made one per op (docs/benchmarks.md: 85 to 197 a strong batch).
    assert 0 < counts[("| strong", "host-to-device copies")] <= 3
    assert "each seed gave the same bytes on both its passes on every batch" in out
