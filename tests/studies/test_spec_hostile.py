"""Hostile study files of issue 36: each refused with the field, the rule and the fix, never a traceback."""

from pathlib import Path

import pytest
import yaml

from studies.spec import StudyError, load_study


def write(tmp_path: Path, data) -> Path:
    p = tmp_path / "study.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


@pytest.mark.parametrize(
    "factors, shown",
    [({"optimizer": ["sam", 0.003]}, "'sam'"), ({"f": {"a": {"optimizer": 5}}}, "got 5")],
    ids=["list-factor-on-a-section", "scalar-level-on-a-section"],
)
def test_a_level_setting_a_section_to_a_value_is_refused_not_crashed(tmp_path, factors, shown):
    # Before: AttributeError ('str'/'int' object has no attribute 'get') inside expand.
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, {"name": "t", "base": {"data": {"name": "digits"}}, "factors": factors}))
    text = str(err.value)
    assert "optimizer: Input should be a valid dictionary" in text and shown in text
