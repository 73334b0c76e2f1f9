"""benchmarks/bench_seeded_batches.py --quick on CPU: a row for each host form, both ways timed, and the seeding."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_run_prints_a_row_for_each_form(capsys):
    from benchmarks import bench_seeded_batches as bench

    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    rows = [ln.split(" | ") for ln in out.splitlines() if ln.startswith("| ") and not ln.startswith("| form")]
    assert [r[0].removeprefix("| ") for r in rows] == [label for label, _ in bench.FORMS]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 and float(r[3]) > 0 for r in rows)
    assert "a worker's seeding per batch" in out and "all three" in out
