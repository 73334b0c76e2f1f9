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


def _imports(package: str, *, deep: bool) -> dict[str, set[str]]:
    """Each module of ``package`` (``deep``: its subpackages' too, ``data.registry``, a subpackage's ``__init__`` as
    ``data``) -> the modules of it that it imports anywhere: at the top, inside a function, or for type checkers
    only. A name imported from a lazily exporting package counts as an import of the module that defines it."""
    folder = Path(importlib.import_module(package).__file__).parent
    names = {}
    for path in folder.rglob("*.py") if deep else folder.glob("*.py"):
        parts = path.relative_to(folder).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if parts:
            names[".".join(parts)] = path
    homes = {}  # a lazily exporting (sub)package's public names -> the modules defining them
    for module in [package, *(f"{package}.{m}" for m in names if names[m].name == "__init__.py")]:
        getter = getattr(importlib.import_module(module), "__getattr__", None)
        for name, home in getattr(getter, "homes", {}).items():
            homes[f"{module}.{name}"] = f"{module}.{home}"

    def within(absolute: str) -> str | None:
        """``absolute`` (a dotted module path) as a module of ``package``, or None when it is not one."""
        while absolute.startswith(f"{package}."):
            if absolute[len(package) + 1 :] in names:
                return absolute[len(package) + 1 :]
            absolute = absolute.rpartition(".")[0]  # a name inside a module: the module
        return None

    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        own = f"{package}.{module}" if path.name == "__init__.py" else f"{package}.{module}".rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = own.rsplit(".", node.level - 1)[0] if node.level else ""
                source = ".".join(p for p in (base, node.module) if p)
                for alias in node.names:
                    target = homes.get(f"{source}.{alias.name}", f"{source}.{alias.name}")
                    found.add(within(target))
            elif isinstance(node, ast.Import):
                found |= {within(a.name) for a in node.names}
        graph[module] = found - {None, module}
    return graph


# Subpackages walked too (trainables.data, studies.spec), but analysis's: analysis.geometry.names reads the probe
# class that imports it back (issue 33's item 4 hands the probe over as an object instead).
@pytest.mark.parametrize(
    ("package", "deep"), [("optim", True), ("trainables", True), ("analysis", False), ("studies", True)]
)
def test_no_import_circle_among_a_packages_modules(package, deep):
    graph = _imports(package, deep=deep)
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


def _named_in_docs_and_notebooks() -> set[tuple[str, str]]:
    """(module, name) for each `from analysis.MODULE import NAME` and `analysis.MODULE.NAME` of docs/ and the
    notebooks: what analysis's users are shown to call."""
    import json
    import re

    root = Path(__file__).resolve().parents[2]
    texts = [p.read_text() for p in sorted((root / "docs").rglob("*.md"))]
    for nb in sorted((root / "analysis" / "notebooks").glob("*.ipynb")):
        texts += ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"]]
    text = "\n".join(texts)
    found = set()
    for m in re.finditer(r"\bfrom (analysis\.[a-z_]+) import \(?([\w, \n]+)\)?", text):
        found |= {(m.group(1), n) for n in re.split(r"[,\s]+", m.group(2)) if n}
    found |= {(m.group(1), m.group(2)) for m in re.finditer(r"\b(analysis\.[a-z_]+)\.([A-Za-z_]\w*)\b", text)}
    return found


def test_every_analysis_function_the_docs_and_notebooks_call_is_exported():
    # A function a notebook imports from its module is one users call: `from analysis import NAME` must find it.
    import inspect

    import analysis

    missing, checked = [], 0
    for module, name in sorted(_named_in_docs_and_notebooks()):
        if name.startswith("_") or module.removeprefix("analysis.") in analysis.__getattr__.submodules:
            continue  # private, or inside a submodule analysis exports whole (analysis.geometry)
        mod = importlib.import_module(module)
        obj = getattr(mod, name, None)
        if name not in getattr(mod, "__all__", ()) or inspect.ismodule(obj) or not callable(obj):
            continue  # constants and submodules are read where they live
        checked += 1
        if name not in analysis.__all__:
            missing.append(f"{module}.{name}")
    assert checked >= 10, f"only {checked} functions found in docs/ and the notebooks: the search missed them"
    assert not missing, f"named in docs/ or a notebook but not exported by analysis/__init__.py: {missing}"
