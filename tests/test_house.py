"""The house rules a reader can check without running anything: no function of the four packages over 100 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("optim", "trainables", "studies", "analysis")
MAX_LINES = 100


def _lengths(path: Path) -> list[tuple[str, int, int]]:
    """Every function and method of a module, nested ones too: (qualified name, first line, lines from its `def`,
    decorators left out, to its last line)."""
    found = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                found.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(path.read_text(), filename=str(path)), "")
    return found


def test_no_function_of_the_four_packages_is_over_100_lines():
    long, walked = [], 0
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            walked += 1
            where = path.relative_to(ROOT).as_posix()
            for name, line, lines in _lengths(path):
                if lines > MAX_LINES:
                    long.append(f"{where}:{line} {name} ({lines} lines)")
    assert walked > 100, f"only {walked} modules walked under {PACKAGES}: the walk missed the packages"
    assert not long, f"functions over {MAX_LINES} lines (split each along its seams into named steps): " + "; ".join(
        long
    )


def test_the_walk_sees_methods_and_nested_functions(tmp_path):
    module = tmp_path / "m.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    module.write_text(
        f"class A:\n    def f(self):\n        def g():\n            pass\n{body.replace('    ', '        ')}\n"
    )
    lengths = {name: lines for name, _, lines in _lengths(module)}
    assert lengths == {"A.f": MAX_LINES + 3, "A.f.g": 2}
