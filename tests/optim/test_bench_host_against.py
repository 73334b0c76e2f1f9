"""benchmarks/bench_optim_host.py --against REV: a method built by its module as it was at a git revision, beside
today's, and today's module back afterwards."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import optim

REPO = Path(__file__).resolve().parents[2]


def _has_history() -> bool:
    done = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], cwd=REPO, capture_output=True)
    return done.returncode == 0


@pytest.mark.skipif(not _has_history(), reason="needs the repository's git history")
def test_a_method_built_from_a_revision_is_that_revisions_module_and_todays_comes_back(helpers):
    from benchmarks.bench_optim_host import _built_from

    model = helpers.make_model(0)
    today = importlib.import_module("optim._rwp")
    with _built_from("HEAD", "rwp"):
        old = helpers.build("rwp", model)
    assert sys.modules["optim._rwp"] is today
    assert sys.modules[type(old).__module__] is today  # named as today's, so @registered finds its entry
    assert type(old) is not today.RWP and type(old).train_step.__wrapped__.__code__.co_filename == "HEAD:optim/_rwp.py"
    assert type(helpers.build("rwp", model)) is today.RWP
    out = helpers.run(old, model, 2)  # the revision's class steps with today's rest of optim
    assert all(torch.isfinite(o.loss) for o in out)
    with pytest.raises(subprocess.CalledProcessError), _built_from("no-such-revision", "rwp"):
        pass
    assert sys.modules["optim._rwp"] is today
    assert optim.METHODS["rwp"].build is today.RWP
