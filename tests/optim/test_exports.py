"""optim.lazy: each package's public names stated once, loaded on first use, the stub type checkers read derived from
the declaration and held current, and the declaration refusing a name with two homes; and no import circle among a
package's modules."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from optim import lazy


@pytest.mark.parametrize("package", lazy.PACKAGES)
def test_the_stub_is_the_declaration(package):
    path = lazy.stub_path(package)
    assert path.exists(), f"{path} is missing: run python -c 'from optim.lazy import write_stubs; write_stubs()'"
    assert path.read_text() == lazy.stub(package), (
        f"{path} is stale: run python -c 'from optim.lazy import write_stubs; write_stubs()'"
    )


@pytest.mark.parametrize("package", lazy.PACKAGES)
def test_every_public_name_is_its_homes_object(package):
    pkg = importlib.import_module(package)
    homes = pkg.__getattr__.homes
    assert sorted(pkg.__all__) == pkg.__all__ == sorted([*homes, *pkg.__getattr__.submodules])
    for name, home in homes.items():
        assert getattr(pkg, name) is getattr(importlib.import_module(f"{package}.{home}"), name)
    for name in pkg.__getattr__.submodules:
        assert getattr(pkg, name) is importlib.import_module(f"{package}.{name}")
    assert set(pkg.__all__) <= set(dir(pkg))
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'no_such_name'"):
        pkg.no_such_name  # noqa: B018


@pytest.mark.parametrize("package", lazy.PACKAGES)
def test_importing_a_package_loads_none_of_its_homes(package):
    code = (
        f"import sys, {package} as p; homes = {{f'{package}.' + h for h in p.__getattr__.homes.values()}}; "
        "print(sorted(homes & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_name_with_two_homes_is_refused():
    with pytest.raises(TypeError, match=r"^pkg: 'x' is exported from both 'a' and 'b'; state it once$"):
        lazy.exports("pkg", {"a": ("x",), "b": ("x", "y")})
    with pytest.raises(TypeError, match=r"both as submodules and as names"):
        lazy.exports("pkg", {"a": ("geometry",)}, modules=("geometry",))


def _imports(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` (its files, not subpackages) -> the modules of it that it imports anywhere: at the
    top, inside a function, or for type checkers only."""
    folder = Path(importlib.import_module(package).__file__).parent
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for module in modules:
        found = set()
        for node in ast.walk(ast.parse((folder / f"{module}.py").read_text())):
            if isinstance(node, ast.ImportFrom):
                absolute = node.module if not node.level else f"{package}.{node.module or ''}".rstrip(".")
                if absolute == package:
                    found |= {a.name for a in node.names}
                elif absolute and absolute.startswith(f"{package}."):
                    found.add(absolute.split(".")[1])
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[1] for a in node.names if a.name.startswith(f"{package}.")}
        graph[module] = (found & modules) - {module}
    return graph


@pytest.mark.parametrize("package", ["optim", "trainables", "analysis", "studies"])
def test_no_import_circle_among_a_packages_modules(package):
    graph = _imports(package)
    for start in graph:
        path, seen = [start], set()
        stack = [(start, iter(sorted(graph[start])))]
        while stack:
            node, rest = stack[-1]
            nxt = next(rest, None)
            if nxt is None:
                stack.pop()
                path.pop()
                seen.add(node)
                continue
            assert nxt != start, f"{package}: import circle {' -> '.join([*path, nxt])}"
            if nxt not in seen and nxt not in path:
                path.append(nxt)
                stack.append((nxt, iter(sorted(graph[nxt]))))
