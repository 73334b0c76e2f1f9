"""`sharpscale validate` of every shipped study (its full form and its --smoke form) imports no torch, timm or torchvision: what keeps it within its 3 s (benchmarks/bench_startup.py times it)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_validating_every_shipped_study_imports_no_torch(tmp_path, fresh_python):
    studies = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "studies").glob("*.yaml"))
    assert len(studies) >= 6
    code = (
        "from studies.cli import main\n"
        f"for study in {studies!r}:\n"
        f"    assert main(['validate', study, '--set', 'data.root={tmp_path}']) == 0, study\n"
        "    assert main(['validate', study, '--smoke']) == 0, study\n"
    )
    fresh_python(code, not_imported=("torch", "timm", "torchvision", "ray", "mlflow"))


def test_building_the_clis_parser_imports_no_archive_or_network_code(fresh_python):
    # Every command builds the whole parser: `data prepare`'s help reads trainables.data.prepare's constants, which must
    # not bring tarfile or multiprocessing (trainables.data.fetch, the worker pool) into each command's start.
    code = "from studies.cli import build_parser\nbuild_parser()\n"
    fresh_python(code, not_imported=("tarfile", "multiprocessing", "trainables.data.fetch"))
