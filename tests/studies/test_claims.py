"""One driver per launch: `run` and `resume` both hold the launch's driver claim, a second driver is refused at once
naming the first, and a claim whose holder died is taken over with a line saying so."""

import multiprocessing
import os
import socket

import pytest

from studies import identity
from studies.launch import Launch, choose_launch, experiment, parent_runs
from studies.runner import run_study, state_locations
from studies.spec import StudyError, load_study
from trainables.naming import launch_name
from trainables.tracking import tracking_client


def _interrupted_launch(path, uri) -> None:
    """What an interrupted `run` leaves in the store: launch 1 claimed, its study and cell runs KILLED, no driver."""
    study = load_study(path, require_data=False)
    client = tracking_client(uri)
    exp_id = experiment(client, study.experiment_name, path.parent / "mlartifacts", uri)
    launch = choose_launch(client, exp_id, study, study.experiment_name, uri, new_launch=False)
    locations = state_locations(study, launch_name(study.experiment_name, launch))
    opened: list[str] = []
    parent_runs(client, study, exp_id, "abc", None, locations.tags(), launch, opened, {})
    for rid in opened:
        client.set_terminated(rid, status="KILLED")


def _resume(path: str, uri: str, barrier, out) -> None:
    """A resume's first step, started beside another at the same moment; the winner exits holding the claim (as a
    driver killed hard would)."""
    study = load_study(path, require_data=False)
    tracking_client(uri)  # connected before the barrier: both claim at once
    barrier.wait(timeout=120)
    try:
        Launch.open(study, uri, resume=True, new_launch=False, explicit=True)
        out.put(("driving", os.getpid()))
    except StudyError as err:
        out.put(("refused", str(err)))


def test_two_resumes_at_once_one_drives_the_other_is_refused_naming_it(tmp_path, tracking_uri, tiny_study, capsys):
    path = tiny_study(tmp_path, "twice")
    _interrupted_launch(path, tracking_uri)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_resume, args=(str(path), tracking_uri, barrier, out)) for _ in range(2)]
    for p in procs:
        p.start()
    got = sorted(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert [g[0] for g in got] == ["driving", "refused"], got
    (_, winner), (_, refusal) = got
    assert f"`sharpscale resume` (pid {winner} on host {socket.gethostname()}, since " in refusal, refusal
    assert "launch 1 of study 'twice'" in refusal and f"`kill -INT {winner}`" in refusal
    assert f"then `sharpscale resume {path}`" in refusal and "--trust-storage" not in refusal

    # The winner ended without giving the claim back (as a driver killed hard): the next resume takes it over.
    study = load_study(path, require_data=False)
    launch = Launch.open(study, tracking_uri, resume=True, new_launch=False, explicit=True)
    said = capsys.readouterr().out
    assert f"driver `sharpscale resume` (pid {winner} on host" in said and "takes its claim over" in said, said
    holder = identity.driver_holder(launch.client, "twice", 1)
    assert holder is not None and holder.pid == os.getpid() and holder.command == "resume"
    launch.release_driver()
    assert identity.driver_holder(launch.client, "twice", 1) is None


def test_a_resume_or_run_while_the_launch_runs_is_refused_for_that_reason(tmp_path, tracking_uri, tiny_study, no_ray):
    path = tiny_study(tmp_path, "busy")
    _interrupted_launch(path, tracking_uri)
    study = load_study(path, require_data=False)
    driving = Launch.open(study, tracking_uri, resume=True, new_launch=False, explicit=True)  # the launch's driver
    try:
        for trust in (False, True):
            with pytest.raises(StudyError) as err:
                run_study(path, tracking_uri=tracking_uri, resume=True, trust_storage=trust)
            text = str(err.value)
            assert f"is being driven by `sharpscale resume` (pid {os.getpid()}" in text, text
            assert "--trust-storage" not in text and "Tune's state" not in text
        with pytest.raises(StudyError) as err:
            run_study(path, tracking_uri=tracking_uri)
        assert f"Its driver, `sharpscale resume` (pid {os.getpid()}" in str(err.value), str(err.value)
    finally:
        driving.release_driver()
    # The refusals gave back nothing of the running driver's, and took nothing: the claim is free now.
    assert identity.driver_holder(driving.client, "busy", 1) is None


def test_a_claim_held_from_another_host_is_taken_only_when_asked(tmp_path, tracking_uri, tiny_study, monkeypatch):
    path = tiny_study(tmp_path, "far")
    _interrupted_launch(path, tracking_uri)
    study = load_study(path, require_data=False)
    real = socket.gethostname()
    monkeypatch.setattr(socket, "gethostname", lambda: "node-7")
    elsewhere = Launch.open(study, tracking_uri, resume=True, new_launch=False, explicit=True)
    assert elsewhere.driving
    monkeypatch.setattr(socket, "gethostname", lambda: real)
    with pytest.raises(StudyError) as err:
        Launch.open(study, tracking_uri, resume=True, new_launch=False, explicit=True)
    text = str(err.value)
    assert "on host node-7" in text and f"`kill -INT {os.getpid()}` on node-7" in text
    assert f"`sharpscale resume --take-over {path}` takes the claim" in text
    taken = Launch.open(study, tracking_uri, resume=True, new_launch=False, explicit=True, take_over=True)
    holder = identity.driver_holder(taken.client, "far", 1)
    assert holder is not None and holder.host == real
    elsewhere.release_driver()  # the old holder's late release leaves the new holder's claim alone
    assert identity.driver_holder(taken.client, "far", 1) == holder
    taken.release_driver()
