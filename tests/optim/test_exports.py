"""optim.lazy: each package's public names stated once, loaded on first use, the stub type checkers read derived from
the declaration and held current, and the declaration refusing a name with two homes."""

from __future__ import annotations

import importlib
import subprocess
import sys

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
