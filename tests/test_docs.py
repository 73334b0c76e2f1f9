"""The reference pages' generated blocks are what their sources say now, and the README stays a front page."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("update_readme", REPO / "docs" / "update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


@pytest.mark.parametrize("page, begin, end, make", GEN.PAGES, ids=[page for page, *_ in GEN.PAGES])
def test_generated_page_is_current(page, begin, end, make):
    assert GEN.block(page, begin, end) == make(), f"{page} is stale: run {GEN.REGENERATE} (then commit the page)"


def test_config_page_covers_every_trial_setting_with_a_description():
    from trainables.config import TrialConfig

    page = (REPO / "docs" / "config.md").read_text()
    undescribed = []
    for section, field in TrialConfig.model_fields.items():
        for key, sub in field.annotation.model_fields.items():
            assert f"| `{section}.{key}` |" in page, f"docs/config.md lacks {section}.{key}: run {GEN.REGENERATE}"
            if not (sub.description or "").strip():
                undescribed.append(f"{section}.{key}")
    assert not undescribed, f"give these fields of trainables/config.py a description=: {undescribed}"


def test_cli_page_has_every_command():
    from studies.cli import build_parser

    page = (REPO / "docs" / "cli.md").read_text()
    paths = [path for path, _ in GEN._subcommands(build_parser())]
    assert len(paths) >= 12, paths  # the top level, eleven commands, data's two
    for path in paths:
        assert f"### `{' '.join(('sharpscale', *path))}`" in page, path


def test_readme_is_a_front_page_that_links_its_reference():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150, "README.md is the front page: reference goes in a docs/ page it links"
    linked = {line.split("](", 1)[1].split(")", 1)[0] for line in readme.splitlines() if "](docs/" in line}
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"
    assert all((REPO / link).is_file() for link in linked), linked


def _benchmarks_generator():
    spec = importlib.util.spec_from_file_location("update_benchmarks", REPO / "docs" / "update_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _benchmarks_generator()


@pytest.mark.parametrize("name", BENCH.names())
def test_benchmarks_page_tables_are_the_results_files(name):
    text = BENCH.PAGE.read_text()
    assert BENCH.block(text, name) is not None, f"docs/benchmarks.md has no block for benchmarks/results/{name}.csv"
    assert BENCH.block(text, name) == BENCH.table(name), f"docs/benchmarks.md is stale: run {BENCH.REGENERATE}"


def test_every_results_file_answers_a_question_and_a_new_one_is_picked_up_by_its_pattern(tmp_path, monkeypatch):
    assert BENCH.unclaimed() == [], "add each results file to the Question it answers (docs/update_benchmarks.py)"
    # A script's new file (here imagefolder_dali.csv) joins its question's table by the question's file patterns.
    for name in ("startup", "imagefolder_dali"):
        (tmp_path / f"{name}.csv").write_text(
            "card,versions,commit,date,command,figure,value,unit,note\n"
            f"Card,v,abc,2026-01-01,python -m benchmarks.x,{name} figure,1.5,x,\n"
            "Card,v,abc,2026-01-01,python -m benchmarks.x,[a table] row one :: col,2,,\n"
        )
    monkeypatch.setattr(BENCH, "RESULTS", tmp_path)
    assert BENCH.unclaimed() == []
    text = BENCH.table("imagefolder")
    assert "| imagefolder_dali figure | 1.5 x | Card | 2026-01-01, abc |" in text
    assert "**a table**: Card" in text and "| row one | 2 |" in text  # a wide figure back in its wide table
    (tmp_path / "unasked.csv").write_text((tmp_path / "startup.csv").read_text())
    assert BENCH.unclaimed() == ["unasked"]


def test_a_rerun_supersedes_the_figure_it_measures_on_its_card():
    rows = [
        {"card": "A", "figure": "x", "value": "1"},
        {"card": "A", "figure": "y", "value": "2"},
        {"card": "B", "figure": "x", "value": "3"},
        {"card": "A", "figure": "x", "value": "4"},
    ]
    assert [(r["card"], r["figure"], r["value"]) for r in BENCH.current(rows)] == [
        ("A", "x", "4"),
        ("A", "y", "2"),
        ("B", "x", "3"),
    ]
