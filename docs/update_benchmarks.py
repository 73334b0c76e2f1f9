"""Regenerates docs/benchmarks.md's tables from benchmarks/results/*.csv: one table per question, its current figures.

  python docs/update_benchmarks.py

QUESTIONS says which results files answer which question and which of their columns the table shows. Each
`<!-- results: SLUG -->` ... `<!-- /results: SLUG -->` block of docs/benchmarks.md becomes the table of its question:
the newest row of each figure on each card of each of its files (rows are appended in the order they were measured;
an older row of the same figure and card is superseded, and stays in git), then the commands and versions that
measured them. A file that answers no question, a question without its block, or a stale block fails
tests/test_docs.py, and this script names the fix.
"""

from __future__ import annotations

import csv
import fnmatch
import re
import sys
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "benchmarks.md"
RESULTS = REPO / "benchmarks" / "results"
REGENERATE = "python docs/update_benchmarks.py"
# A table's columns: any results column, or `measured` (its date and commit) and `value` (with its unit).
DEFAULT_COLUMNS = ("figure", "value", "card", "measured", "note")


class Question(NamedTuple):
    slug: str  # the page's block name
    question: str  # what the table answers (the section's heading says it in words)
    files: tuple[str, ...]  # results file stems, or fnmatch patterns of them (a script's future files)
    columns: tuple[str, ...] = DEFAULT_COLUMNS


QUESTIONS = (
    Question("imagefolder", "Does a plain ImageNet folder feed the GPU?", ("imagefolder*", "data_path*")),
    Question("method-cost", "What does each method cost per step?", ("optim", "optim_eager*")),
    Question("host-share", "What share of a step is the host's?", ("optim_host*",)),
    Question("loop", "What do the training loop and its scaling cost against a bare step?", ("loop*",)),
    Question("geometry", "What does a geometry measurement cost?", ("geometry*",)),
    Question("trial-cost", "What does a trial cost, part by part, on each card?", ("trial_cost", "trial_time*")),
    Question("estimate", "Does the dry run's estimate hold?", ("estimate",)),
    Question("startup", "How fast does the command start?", ("startup",)),
    Question("records", "How fast are a study's records read back?", ("load_runs*",)),
    Question("scaling-fit", "Does the scaling-law fitter beat M4 on published curves?", ("scaling_curves*",)),
    Question("coverage", "Do the report's intervals cover?", ("*coverage*", "sim_*")),
)


def markers(name: str) -> tuple[str, str]:
    return f"<!-- results: {name} -->", f"<!-- /results: {name} -->"


def current(rows: list[dict]) -> list[dict]:
    """The newest row of each (card, figure), in the order the figures first appear."""
    newest: dict[tuple[str, str], dict] = {}
    for row in rows:
        newest.pop((row["card"], row["figure"]), None)  # re-inserted: a rerun keeps its place among the newest
        newest[(row["card"], row["figure"])] = row
    order = list(dict.fromkeys((r["card"], r["figure"]) for r in rows))
    return [newest[key] for key in order]


def files() -> list[str]:
    return sorted(p.stem for p in RESULTS.glob("*.csv"))


def files_of(question: Question) -> list[str]:
    return [name for name in files() if any(fnmatch.fnmatchcase(name, pattern) for pattern in question.files)]


# Results files another page renders with its own generator (their columns are not a figure's row).
ELSEWHERE = {
    "report_null": "docs/science.md, by python -m benchmarks.sim_report_null --summarise",
    "null_intervals": "docs/science.md, by python -m benchmarks.sim_null_intervals --markdown",
}


def unclaimed() -> list[str]:
    """Results files no question shows and no other page renders."""
    claimed = {name for q in QUESTIONS for name in files_of(q)} | set(ELSEWHERE)
    return [name for name in files() if name not in claimed]


def _question(slug: str) -> Question:
    return next(q for q in QUESTIONS if q.slug == slug)


def _cell(row: dict, column: str) -> str:
    if column == "measured":
        text = f"{row['date']}, {row['commit']}"
    elif column == "value":
        text = f"{row['value']} {row['unit']}".strip()
    else:
        text = row.get(column) or ""
    return text.replace("|", "\\|")


# A figure of a wide table (transcribed from the page's hand-written tables): `[its table] its row :: its column`.
WIDE = re.compile(r"\[(?P<table>[^\]]+)\] (?P<row>.*) :: (?P<column>.*)")


def _wide(tag: str, rows: list[dict]) -> list[str]:
    """The rows of one wide table, its row labels down and its columns across, under a line naming where from."""
    cells: dict[str, dict[str, str]] = {}
    columns: list[str] = []
    for r in rows:
        found = WIDE.fullmatch(r["figure"])
        columns += [found["column"]] if found["column"] not in columns else []
        cells.setdefault(found["row"], {})[found["column"]] = _cell(r, "value")
    first = rows[0]
    out = [f"**{tag}**: {first['card']}, {first['date']}, {first['commit']}; {first['note']}.", ""]
    out += ["| | " + " | ".join(c.replace("|", "\\|") for c in columns) + " |"]
    out += ["| --- " * (len(columns) + 1) + "|"]
    for label, values in cells.items():
        escaped = label.replace("|", "\\|")
        out.append(f"| {escaped} | " + " | ".join(values.get(c, "") for c in columns) + " |")
    return out + [""]


def table(slug: str) -> str:
    question = _question(slug)
    names = files_of(question)
    if not names:
        return "Not measured yet: no results file of this question (QUESTIONS in docs/update_benchmarks.py)."
    rows = []
    for name in names:
        with (RESULTS / f"{name}.csv").open(newline="") as f:
            rows += [{**r, "file": name} for r in current(list(csv.DictReader(f)))]
    long = [r for r in rows if not WIDE.fullmatch(r["figure"])]
    out = []
    if long:
        columns = question.columns + (("file",) if len({r["file"] for r in long}) > 1 else ())
        out += ["| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
        out += ["| " + " | ".join(_cell(r, c) for c in columns) + " |" for r in long]
        out.append("")
    wide: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        if found := WIDE.fullmatch(r["figure"]):
            wide.setdefault((found["table"], r["card"]), []).append(r)
    for (tag, _), group in wide.items():
        out += _wide(tag, group)
    for command, versions in dict.fromkeys((r["command"], r["versions"]) for r in rows):
        out.append(f"Measured by `{command}` ({versions}).")
    return "\n".join(out)


def names() -> list[str]:
    """The page's blocks: one per question."""
    return [q.slug for q in QUESTIONS]


def block(text: str, name: str) -> str | None:
    begin, end = markers(name)
    if begin not in text or end not in text:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def main() -> None:
    if left := unclaimed():
        sys.exit(
            f"benchmarks/results/{left[0]}.csv answers no question: add its name to the Question it answers in "
            "docs/update_benchmarks.py QUESTIONS (or a new Question, with its block in docs/benchmarks.md)"
        )
    text = PAGE.read_text()
    for name in names():
        begin, end = markers(name)
        if block(text, name) is None:
            sys.exit(f"docs/benchmarks.md has no {begin} ... {end} block: add one under the question's heading")
        body = table(name)
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: f"{begin}\n{body}\n{end}", text, flags=re.S)
    PAGE.write_text(text)


if __name__ == "__main__":
    main()
