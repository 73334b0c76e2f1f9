"""Regenerates docs/benchmarks.md's tables from benchmarks/results/*.csv: one table per question, its current figures.

  python docs/update_benchmarks.py

Each `<!-- results: NAME -->` ... `<!-- /results: NAME -->` block of docs/benchmarks.md becomes the table of
benchmarks/results/NAME.csv: the newest row of each figure on each card (rows are appended in the order they were
measured; an older row of the same figure and card is superseded, and stays in git), then the commands and versions
that measured them. tests/test_docs.py fails while a block is stale or a results file has no block.
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "benchmarks.md"
RESULTS = REPO / "benchmarks" / "results"
REGENERATE = "python docs/update_benchmarks.py"


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


def table(name: str) -> str:
    with (RESULTS / f"{name}.csv").open(newline="") as f:
        rows = current(list(csv.DictReader(f)))
    cell = lambda s: s.replace("|", "\\|")  # noqa: E731
    out = ["| figure | value | card | measured | note |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        value = f"{r['value']} {r['unit']}".strip()
        out.append(
            f"| {cell(r['figure'])} | {cell(value)} | {cell(r['card'])} | {r['date']}, {r['commit']} | {cell(r['note'])} |"
        )
    out.append("")
    for command, versions in dict.fromkeys((r["command"], r["versions"]) for r in rows):
        out.append(f"Measured by `{command}` ({versions}).")
    return "\n".join(out)


def names() -> list[str]:
    return sorted(p.stem for p in RESULTS.glob("*.csv"))


def block(text: str, name: str) -> str | None:
    begin, end = markers(name)
    if begin not in text or end not in text:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def main() -> None:
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
