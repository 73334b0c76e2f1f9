"""benchmarks/bench_optim.py --profile on CPU: every variant, and the compiled model's parts, get their line."""

from __future__ import annotations

from pathlib import Path

import pytest

# The whole benchmark script, end to end: a minute or more on 2 cores, so not in make test-fast.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _load():
    from benchmarks import bench_optim

    return bench_optim


def test_profile_prints_each_variant_and_the_compiled_parts(capsys, monkeypatch):
    bench = _load()
    import trainables.compiled as compiled

    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")  # the same graphs run eagerly: affordable on a small CPU
    argv = ["--quick", "--models", "resnet_tiny", "--methods", "none,sam", "--compile", "--profile"]
    assert bench.main([*argv, "--steps", "1", "--repeats", "1", "--warmup", "1"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("# profile resnet_tiny/")]
    keys = {ln.split(":")[0].removeprefix("# profile resnet_tiny/") for ln in lines}
    assert {"none", "sam", "none@compiled", "sam@compiled", "fwd+bwd@compiled", "fwd+bwd+adamw@compiled"} <= keys
    for ln in lines:
        wall = float(ln.split("wall ")[1].split(" ms/step")[0])
        host = float(ln.split("host issue ")[1].split(" ms/step")[0])
        assert 0 < host <= wall  # the host has issued every step before the last one ends


def test_compile_modes_are_timed_side_by_side(capsys, monkeypatch):
    bench = _load()
    import trainables.compiled as compiled

    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    argv = ["--quick", "--models", "resnet_tiny", "--methods", "none", "--compile", "--compile-modes"]
    assert bench.main([*argv, "reduce-overhead,default", "--steps", "1", "--repeats", "1", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    for key in ("none@compiled", "none@default"):
        assert f"resnet_tiny/{key}: first step (compiling)" in out
        assert any(ln.startswith("|") and key in ln for ln in out.splitlines())  # a row of the table
    with pytest.raises(SystemExit):
        bench.main([*argv, "reduce-overhead,fastest"])
