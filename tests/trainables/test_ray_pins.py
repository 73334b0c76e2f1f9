"""Pins of the Ray internals that `trainables.ray_train.tune_trainable` relies on: a Ray release that changes them
fails here, by name, instead of silently skipping the repair of a resumed trial's checkpoint."""

import inspect


def test_tune_trainable_is_a_function_trainable_that_overrides_restore():
    # wrap_function is Ray's DeveloperAPI (ray.tune.trainable.__all__), the only way to add to a function
    # trainable's restore without rewriting the loop as a class Trainable.
    import ray.tune.trainable as rtt

    from trainables.ray_train import tune_trainable

    assert "wrap_function" in rtt.__all__
    cls = tune_trainable()
    assert issubclass(cls, rtt.FunctionTrainable)
    assert "restore" in vars(cls)


def test_tune_restores_a_trial_from_a_training_result_with_checkpoint_and_metrics():
    # Tune calls Trainable.restore with the trial's latest _TrainingResult (Ray's private type); _restore_point
    # reads its .checkpoint and .metrics and builds another with type(result)(checkpoint=..., metrics=...).
    from ray.train._internal.session import _TrainingResult
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.trainable import Trainable

    source = inspect.getsource(TuneController._schedule_trial_restore)
    assert "latest_checkpoint_result" in source and '"restore"' in source
    assert "_TrainingResult" in str(inspect.signature(Trainable.restore).parameters["checkpoint_path"].annotation)
    result = _TrainingResult(checkpoint=None, metrics={"training_iteration": 3})
    assert result.checkpoint is None and result.metrics == {"training_iteration": 3}


def test_the_tune_state_files_resume_checks_are_the_ones_tune_restores_from():
    # studies.identity names the files Tuner.restore unpickles, by Tune's private names; resume checks their sha256
    # before Tune reads them. Tune reads the newest of each pattern by name (max of the glob), so identity records
    # and checks exactly that one.
    import fnmatch

    from ray.tune.callback import CallbackList
    from ray.tune.execution.experiment_state import _find_newest_experiment_checkpoint
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.impl.tuner_internal import _TUNER_PKL, TunerInternal
    from ray.tune.search.basic_variant import BasicVariantGenerator
    from ray.tune.search.search_generator import SearchGenerator
    from ray.tune.utils.util import _load_newest_checkpoint

    from studies.identity import NEWEST_STATES, TUNER_STATE

    assert _TUNER_PKL == TUNER_STATE
    tune_patterns = [
        cls.CKPT_FILE_TMPL.format("*") for cls in (TuneController, SearchGenerator, CallbackList, BasicVariantGenerator)
    ]
    assert tune_patterns == list(NEWEST_STATES)
    assert "max(matching)" in inspect.getsource(_find_newest_experiment_checkpoint)
    assert "max(full_paths)" in inspect.getsource(_load_newest_checkpoint)
    for cls in (SearchGenerator, CallbackList, BasicVariantGenerator):
        assert "_load_newest_checkpoint" in inspect.getsource(cls.restore_from_dir)
    restore = inspect.getsource(TuneController.resume)
    assert "_search_alg.restore_from_dir" in restore and "_callbacks.restore_from_dir" in restore
    assert fnmatch.fnmatch(TuneController.CKPT_FILE_TMPL.format("2026-01-01_00-00-00"), NEWEST_STATES[0])
    assert "pickle.loads" in inspect.getsource(TunerInternal._restore_from_path_or_uri)


def test_tune_stops_a_function_trial_in_its_report_without_waiting_for_what_follows():
    # SharpscaleTrial.cleanup and reset_config wait for a trial Tune stopped inside its report, because Tune does
    # not: cleanup wakes it without waiting, reset_config waits TUNE_FUNCTION_THREAD_TIMEOUT_S, and a second
    # reset_config starts a fresh session. A Ray that changes any of these fails here.
    from ray.train._internal.session import _TrainSession
    from ray.tune.trainable import FunctionTrainable

    from trainables.ray_train import tune_trainable

    assert "session.finish(timeout=0)" in inspect.getsource(FunctionTrainable.cleanup)
    reset = inspect.getsource(FunctionTrainable.reset_config)
    assert "TUNE_FUNCTION_THREAD_TIMEOUT_S" in reset and "return False" in reset and "session.reset(" in reset
    assert "sys.exit(0)" in inspect.getsource(_TrainSession._report_training_result)
    fresh = inspect.getsource(_TrainSession.reset)
    assert "self.stop_event = threading.Event()" in fresh and "self.training_thread = RunnerThread(" in fresh
    assert {"cleanup", "reset_config"} <= set(vars(tune_trainable()))
