"""MLflow names have one home (trainables.naming): their values, their builders, and no copy anywhere else."""

import ast
import json
import re
from pathlib import Path

import pytest

from trainables import naming

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("optim", "trainables", "studies", "analysis", "benchmarks")


def test_tag_keys_are_the_recorded_contract():
    # Stored runs and users' MLflow filters carry these strings: changing one orphans every earlier record.
    assert naming.KIND_TAG == "sharpscale.kind"
    assert naming.STATUS_TAG == "sharpscale.status"
    assert naming.LAUNCH_TAG == "sharpscale.launch"
    assert naming.TRIAL_KEY_TAG == "sharpscale.trial_key"
    assert naming.TRIAL_ID_TAG == "sharpscale.trial_id"
    assert naming.CELL_TAG == "sharpscale.cell"
    assert naming.STUDY_FILE_HASH_TAG == "sharpscale.study_file_hash"
    assert naming.factor_tag("arch") == "factor.arch"
    assert naming.kind_filter("trial") == "tags.`sharpscale.kind` = 'trial'"
    assert naming.DEFAULT_TRACKING_URI == "sqlite:///mlflow.db"


@pytest.mark.parametrize(
    ("study", "experiment", "smoke", "expected"),
    [
        ("quickstart", None, False, "quickstart"),
        ("quickstart", None, True, "quickstart-smoke"),
        ("quickstart", "qs-v2", False, "qs-v2"),
        ("quickstart", "qs-v2", True, "qs-v2-smoke"),
    ],
)
def test_experiment_name(study, experiment, smoke, expected):
    assert naming.experiment_name(study, experiment, smoke=smoke) == expected


def test_run_names():
    assert naming.launch_name("quickstart", 1) == "quickstart"
    assert naming.launch_name("quickstart", 3) == "quickstart-launch3"
    assert naming.study_run_name("quickstart", 1) == "quickstart"
    assert naming.study_run_name("quickstart", 2) == "quickstart (launch 2)"


def _strings(source: str):
    """Every string literal of a module (f-string pieces included), with its line; logger names excepted."""
    tree = ast.parse(source)
    loggers = {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "getLogger"
        for arg in node.args
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in loggers:
            yield node.lineno, node.value


# A tag key, a filter on one, the default store, the smoke suffix, MLflow's parent-run tag: spelled out only in naming.
# (A file name such as sharpscale.log is no tag.)
_COPY = re.compile(
    r"sharpscale\.(?!log$)[a-z_]*|.*`sharpscale\.[a-z_]+`.*|sqlite:///mlflow\.db|-smoke|mlflow\.parentRunId"
)


def _sources():
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            yield path, path.read_text()
        for path in sorted((REPO / package).rglob("*.ipynb")):
            cells = json.loads(path.read_text())["cells"]
            code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
            yield path, "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))


def test_no_module_but_naming_spells_out_an_mlflow_name():
    checked, copies = 0, []
    for path, source in _sources():
        if path == REPO / "trainables" / "naming.py":
            continue
        checked += 1
        copies += [
            f"{path.relative_to(REPO)}:{line}: {text!r}" for line, text in _strings(source) if _COPY.fullmatch(text)
        ]
    assert checked >= 40, f"only {checked} modules found under {PACKAGES}: the scan lost its way"
    assert not copies, "import these from trainables.naming instead:\n" + "\n".join(copies)
