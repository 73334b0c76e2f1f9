"""Study files: their schema, their complete validation (every error at once), and their expansion into cells.

The implementation lives in the private modules beside this one (schema, YAML reading, cells, the smoke form,
loading); the names other code uses are these."""

from studies.spec._cells import SEARCH_SHORTHANDS, expand, grid_size
from studies.spec._load import load_study, parse_overrides
from studies.spec._schema import (
    DEFAULT_STORAGE,
    LOCATION_FIELDS,
    MAX_TRIALS,
    SETTABLE_FIELDS,
    Budget,
    Cell,
    Choice,
    Confirm,
    Domain,
    IntRange,
    LoadedStudy,
    LogUniform,
    Study,
    StudyError,
    Uniform,
    deep_merge,
    location_problem,
    optuna_storage_url,
    resolve_storage,
    set_path,
    storage_is_shared,
)
from studies.spec._smoke import smoke_epochs
from studies.spec._yaml import MAX_STUDY_FILE_BYTES, MAX_YAML_NODES, parse_yaml, read_study_text

__all__ = [
    "DEFAULT_STORAGE",
    "LOCATION_FIELDS",
    "MAX_STUDY_FILE_BYTES",
    "MAX_TRIALS",
    "MAX_YAML_NODES",
    "SEARCH_SHORTHANDS",
    "SETTABLE_FIELDS",
    "Budget",
    "Cell",
    "Choice",
    "Confirm",
    "Domain",
    "IntRange",
    "LoadedStudy",
    "LogUniform",
    "Study",
    "StudyError",
    "Uniform",
    "deep_merge",
    "expand",
    "grid_size",
    "load_study",
    "location_problem",
    "optuna_storage_url",
    "parse_overrides",
    "parse_yaml",
    "read_study_text",
    "resolve_storage",
    "set_path",
    "smoke_epochs",
    "storage_is_shared",
]
