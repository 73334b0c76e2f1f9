"""Where the estimate's figures come from: the strong-augmentation share from the data path's measured rows, and the
rows shipped with the package so that an install without the checkout estimates too."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from benchmarks.results import COLUMNS
from studies import cost

REPO = Path(__file__).resolve().parents[2]


def _write(path: Path, rows: list[tuple[str, str, float]]) -> Path:
    with path.open("w") as f:
        f.write(",".join(COLUMNS) + "\n")
        for card, figure, value in rows:
            f.write(f'{card},v,c,2026-01-01,cmd,"{figure}",{value},,\n')
    return path


def test_the_strong_share_is_the_newest_measured_ratio_of_each_method(tmp_path):
    label = cost.STRONG_AUGMENT_PATH
    path = _write(
        tmp_path / "data_path.csv",
        [
            ("Card Y", f"[some table, table 1] {label}, none :: ratio to synthetic", 0.8),  # transcribed
            ("Card Y", f"[some table, table 1] {label}, none :: img/s", 9000),
            ("Card Y x1", f"{label}, none :: ratio to synthetic", 0.85),  # bench_data --record, newer
            ("Card Y x1", f"{label}, sam :: ratio to synthetic", 0.95),
            ("Card Y x1", "other path, sam :: ratio to synthetic", 0.5),
        ],
    )
    assert cost.load_strong_augment_shares(path) == {"none": (0.85, "Card Y"), "sam": (0.95, "Card Y")}
    assert cost.load_strong_augment_shares(tmp_path / "absent.csv") == {}


def test_the_shipped_share_is_read_from_the_rows_bench_data_writes():
    import csv

    from benchmarks import bench_data

    assert cost.STRONG_AUGMENT_PATH in {label for label, _, _ in bench_data.PATHS}
    with (REPO / "benchmarks" / "results" / "data_path.csv").open(newline="") as f:
        rows = [
            r for r in csv.DictReader(f) if f"{cost.STRONG_AUGMENT_PATH}, none :: ratio to synthetic" in r["figure"]
        ]
    assert rows and cost.strong_augment_share("none") == float(rows[-1]["value"])
    # A method without a row of its own is costed at `none`'s share, the most host-bound step.
    assert cost.strong_augment_share("asam") == cost.strong_augment_share("none")


def _strong_study(tmp_path, method: str):
    from studies.spec import load_study

    study = {
        "name": "strong",
        "objective": {"metric": "val_acc", "mode": "max"},
        "base": {
            "model": {"name": "resnet18", "cifar_stem": True},
            "data": {"name": "cifar10", "root": str(tmp_path), "batch_size": 256, "augment": "strong"},
            "schedule": {"epochs": 2},
        },
        "factors": {"m": {method: {"optimizer.method": method}}},
        "budget": {"repeats_without_search": 1},
        "resources": {"cpus_per_trial": 1, "gpus_per_trial": 1},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return load_study(path, require_data=False)


@pytest.mark.parametrize("method", ["none", "sam"])
def test_a_strong_augmentation_trial_is_costed_at_its_methods_measured_share(tmp_path, monkeypatch, method):
    row = cost.CardFigures("Card X", "resnet18", 32, 256, 1000.0, 500.0, 2000.0, "given")
    monkeypatch.setattr(cost, "CARD_FIGURES", (row,))
    monkeypatch.setattr(cost, "REFERENCE_CARD", "Card X")
    monkeypatch.setattr(cost, "_compiles_on_cuda", lambda cfg, workers: False)
    monkeypatch.setattr(cost, "STRONG_AUGMENT_SHARES", {"none": (0.5, "Card Z"), "sam": (0.8, "Card Z")})
    study = _strong_study(tmp_path, method)
    (cell,) = cost.estimate_study(study, gpus=1, cluster_card="Card X").cells
    speed = {"none": 1000.0 * 0.5, "sam": 500.0 * 0.8}[method]
    assert dict(cell.trial_parts)["training"] == pytest.approx(2 * (50_000 // 256) * 256 / speed)
    # Without a measured share the strong cost is named as not counted, not guessed.
    monkeypatch.setattr(cost, "STRONG_AUGMENT_SHARES", {})
    estimate = cost.estimate_study(study, gpus=1, cluster_card="Card X")
    assert "strong augmentation" in estimate.missing
    clean = {"none": 1000.0, "sam": 500.0}[method]
    assert dict(estimate.cells[0].trial_parts)["training"] == pytest.approx(2 * (50_000 // 256) * 256 / clean)


def test_the_full_quickstart_on_cpu_is_estimated_from_its_own_models_rows():
    from studies.spec import load_study

    study = load_study(REPO / "studies" / "quickstart.yaml", require_data=False)
    estimate = cost.estimate_study(study, cpus=2)
    assert estimate.problems == () and estimate.missing == ()
    assert {c.cell for c in estimate.cells} == {"vit/adamw", "vit/sam", "mixer/adamw", "mixer/sam", "resnet/adamw",
                                                "resnet/sam"}  # fmt: skip
    assert estimate.slots == 2 and estimate.wall_h is not None


def test_the_figures_ship_in_the_wheel_so_an_install_without_the_checkout_estimates(tmp_path):
    """A wheel built from a copy of the tree (the links in studies/figures/ kept as links) holds the results files'
    content, and the package reads its figures from its own folder."""
    assert cost.FIGURES_CSV.parent.parent == Path(cost.__file__).resolve().parent  # inside the package
    for name in ("trial_cost.csv", "data_path.csv"):
        assert (cost.FIGURES / name).resolve() == REPO / "benchmarks" / "results" / name  # one home: the benchmark's
    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("optim", "trainables", "studies", "analysis"):
        shutil.copytree(REPO / package, tree / package, symlinks=True, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    (tree / "benchmarks" / "results").mkdir(parents=True)
    for name in ("trial_cost.csv", "data_path.csv"):
        shutil.copy(REPO / "benchmarks" / "results" / name, tree / "benchmarks" / "results" / name)
    code = "import sys; from setuptools import build_meta as b; print(b.build_wheel(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "dist")], cwd=tree, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    wheel = tmp_path / "dist" / done.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as z:
        for name in ("trial_cost.csv", "data_path.csv"):
            assert z.read(f"studies/figures/{name}") == (REPO / "benchmarks" / "results" / name).read_bytes()
        assert not any(n.startswith("benchmarks/") for n in z.namelist())
