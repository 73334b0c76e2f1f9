"""Studies: declarative study files, their validation, their execution on Ray Tune + Optuna, and the CLI."""

from studies.spec import Cell, LoadedStudy, Study, StudyError, load_study

__all__ = ["Cell", "LoadedStudy", "Study", "StudyError", "load_study", "run_study"]


def __getattr__(name: str):
    # Ray is imported only when a study actually runs: validating a file must stay fast and Ray-free.
    if name == "run_study":
        from studies.runner import run_study

        return run_study
    raise AttributeError(name)
