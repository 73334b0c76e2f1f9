"""The package's metadata (pyproject.toml) as setuptools reads it when `make install` builds the editable install."""

import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_pyproject_reads_without_setuptools_deprecations(monkeypatch):
    # A license given as a TOML table is deprecated by setuptools (an error from 2027-02-18) and printed a warning
    # block on every install; the SPDX string needs setuptools >= 77, the build requirement's floor.
    pytest.importorskip("setuptools")
    import tomllib

    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(REPO)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = apply_configuration(Distribution(), REPO / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"
    # Build isolation installs the newest setuptools the index has, at least this floor: one that reads the string.
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    assert "setuptools>=77" in requires, requires
