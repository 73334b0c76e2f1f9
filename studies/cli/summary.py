"""What `run` prints when its study ends (the best trial per cell, where the device time went, the commands to go
on with), and the plain line for a study without a result, which `report` prints too."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from studies.cli.base import prog
from studies.shell import shell_command
from trainables.naming import DEFAULT_TRACKING_URI, REASON_TAG


def _columns() -> int:
    """The terminal's width less one (a line that fills it wraps on some terminals); COLUMNS where it is set."""
    return max(40, shutil.get_terminal_size((100, 30)).columns - 1)


def _say(text: str, indent: str = "") -> None:
    """A paragraph wrapped to the terminal, its continuation lines indented under its start (a leading blank
    line kept): a summary that wraps at the terminal's edge splits words and loses its alignment."""
    lead = "\n" if text.startswith("\n") else ""
    width = _columns()
    body = textwrap.fill(
        text.lstrip("\n"),
        width=width,
        initial_indent=indent,
        subsequent_indent=indent + "    ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    print(lead + body)


def _print_cost(runs, outcome) -> None:
    """Where the study's device time went: each trial's seconds outside training, the held time spent training."""
    from studies.busy import BUSY_METRIC, SAMPLE_MS
    from trainables.metrics import FIXED_PHASES, FIXED_TIME, fixed_phase_metric

    if FIXED_TIME in runs and runs[FIXED_TIME].notna().any():
        fixed = runs[FIXED_TIME].dropna()
        _say(
            f"\nOutside training ({FIXED_TIME}: start, data load, validation, geometry, checkpoints, records): median "
            f"{fixed.median():.1f} s a trial (min {fixed.min():.1f}, max {fixed.max():.1f}; {len(fixed)} trials)."
        )
        parts = {
            p: runs[fixed_phase_metric(p)].median()
            for p in FIXED_PHASES
            if fixed_phase_metric(p) in runs and runs[fixed_phase_metric(p)].notna().any()
        }
        if parts:
            largest = sorted(parts.items(), key=lambda kv: -kv[1])
            _say("Its parts' medians (fixed_<part>_s): " + ", ".join(f"{p} {v:.1f} s" for p, v in largest) + ".", "  ")
    if outcome is not None and outcome.training_share is not None:
        name, value = outcome.training_share
        device = "GPU" if "gpu" in name else "CPU"
        _say(
            f"{name}: {value:.2f} (the trials' training {device}-seconds over the {device} time the study held: its "
            f"wall time x the cluster's {device}s; not the {device}'s utilisation within a step)."
        )
    if outcome is not None and outcome.gpu_busy is not None:
        _say(
            f"{BUSY_METRIC}: {outcome.gpu_busy:.2f} (the share of the study's wall time in which its GPUs ran a kernel, "
            f"NVML's utilisation sampled every {SAMPLE_MS} ms by nvidia-smi on this node; not how much of the GPU each "
            "kernel used)."
        )


def print_summary(study, tracking_uri: str, outcome=None) -> None:
    from analysis import headline, load_runs, summarize
    from analysis.runs import SE_COLUMN, table_format
    from trainables.tracking import resolve_tracking_uri

    spec = study.spec
    name, smoke = study.experiment_name, study.smoke
    runs = load_runs(name, tracking_uri=tracking_uri)
    objective = spec.objective
    print()
    _say(f"Best trial per cell by {objective.label}, {objective.mode} ({len(runs)} trials recorded in MLflow):")
    if none_finished(runs, objective.column):
        _say(no_result_line(runs), "  ")
    else:
        for line in headline(runs, metric=objective.column, mode=objective.mode):  # the study's answer first
            _say(line, "  ")
        searched = tuple(sorted({p for c in study.cells for p in c.space}))
        table = summarize(runs, metric=objective.column, mode=objective.mode, show=searched, label=objective.label)
        with table_format(_columns()):
            # Columns that do not fit go to a block below (pandas' wrapping), not past the terminal's edge.
            print(table.to_string(line_width=_columns()) if not table.empty else "  (no finished trial)")
        if SE_COLUMN in table.columns:
            _say(
                f"({SE_COLUMN}: the sampling error of each best value on its 'val n' validation samples. Cells "
                f"less than about two of them apart are not told apart by this run; the best of a searched cell "
                f"is also the luckiest of its trials.)"
            )
    _print_cost(runs, outcome)
    default_uri = tracking_uri == resolve_tracking_uri(DEFAULT_TRACKING_URI)
    uri_opt = "" if default_uri else f" {shell_command('--tracking-uri', tracking_uri)}"
    study_arg = shell_command(*(["--smoke"] if smoke else []), _shown_path(study.path))
    _say(f"\nRecorded in MLflow at {tracking_uri}, experiment {name!r}. Next:")
    cmd = shell_command(prog())
    _print_next(cmd, uri_opt, study_arg, name)


def _print_next(cmd: str, uri_opt: str, study_arg: str, name: str) -> None:
    """The commands to go on with, each with what it shows; the text goes under its command where both do not fit
    on one line, and a command too long for one line continues on the next with a shell's backslash (it is
    copied as it stands)."""
    rows = [
        (f"{cmd} ui{uri_opt}", "the study's page: its answer, then every trial best first"),
        (f"{cmd} report {study_arg}{uri_opt}", f"tables and plots under reports/{name}"),
        (f"{cmd} status {study_arg}{uri_opt}", "trials per cell and status"),
    ]
    width = _columns()
    pad = max(len(c) for c, _ in rows) + 3
    for command, what in rows:
        if 2 + pad + len(what) <= width:
            print(f"  {command:<{pad}}{what}")
            continue
        if uri_opt and 2 + len(command) > width:
            print(f"  {command.removesuffix(uri_opt)} \\\n      {uri_opt.strip()}")
        else:
            print(f"  {command}")
        _say(what, "      ")


def _shown_path(path: Path) -> str:
    """A path as short as it can be written from here."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def none_finished(runs, metric: str) -> bool:
    """No trial of the records ended with a value of the objective (none yet, or every one failed)."""
    if runs.empty or metric not in runs or "status" not in runs:
        return True
    return runs.loc[runs["status"] == "finished", metric].dropna().empty


def no_result_line(runs) -> str:
    if runs.empty:
        return "no trial recorded yet."
    counts = runs["status"].value_counts() if "status" in runs else {}
    by_status = ", ".join(f"{n} {s}" for s, n in counts.items())
    return (
        f"no trial finished with a result ({by_status}): nothing to tabulate. Each run's {REASON_TAG} tag "
        f"says why; `sharpscale status` counts them."
    )
