"""The commands that act on a study file: `validate` it, `run` it (or print its plan), `resume` it, and
`calibrate` how many of its trials share a GPU."""

from __future__ import annotations

import argparse
import os
import sys

from studies.cli import summary
from studies.cli.base import (
    EXIT_ERRORS,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    Command,
    cluster_options,
    overrides,
    prog,
    study_options,
    tracking_option,
)
from studies.shell import shell_command
from trainables.errors import UserError
from trainables.naming import REASON_TAG

_EXITS = (
    f"Exit status: 0 done; {EXIT_ERRORS} when trials errored or no trial ran an epoch (the study is FAILED); {EXIT_USAGE} for a mistake in the study or the "
    f"options (every problem listed, nothing started); {EXIT_INTERRUPTED} when interrupted (Ctrl-C): the "
    f"study is incomplete and `resume` finishes it."
)


class Run(Command):
    name = "run"
    help = "run a study file (validates it completely first)"
    epilog = _EXITS
    options = (study_options, tracking_option, cluster_options)
    resumes = False

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("study", help="study file, e.g. studies/quickstart.yaml")
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="print the cells and trial counts, what the design can detect (80%% power) and the estimated GPU-hours "
            "(from measured figures, on this machine's card where it has one); run nothing",
        )
        parser.add_argument(
            "--new-launch",
            action="store_true",
            help="the study already ran into this experiment: start another launch, kept apart from the earlier ones "
            "(without it such a run is refused; `resume` continues the newest launch instead)",
        )

    def take_action(self, args) -> int:
        from studies.spec import load_study

        # Every mistake surfaces here, before Ray starts; a dry run reads only the file, so it needs no data.
        study = load_study(args.study, smoke=args.smoke, overrides=overrides(args), require_data=not args.dry_run)
        if args.dry_run:
            _print_cells(study)
            from analysis.design import study_detectable

            statement = study_detectable(study)
            if statement:
                print(f"Design: {statement}")
            _print_estimate(study, args)
            return 0
        return self._ended(study, args, self._run(args))

    def _run(self, args):
        """The study, run (or resumed) to its end; its outcome."""
        # Said before the imports: torch, Ray and a local cluster's start take 40-50 s before the live view draws.
        print(starting_line(args, resumes=self.resumes), flush=True)
        from studies.runner import run_study
        from trainables.tracking import check_tracking_uri

        if args.tracking_uri:
            check_tracking_uri(args.tracking_uri)
        return run_study(
            args.study,
            address=args.address,
            tracking_uri=args.tracking_uri,
            smoke=args.smoke,
            num_cpus=args.num_cpus,
            resume=self.resumes,
            overrides=overrides(args),
            new_launch=getattr(args, "new_launch", False),
            trust_storage=getattr(args, "trust_storage", False),
            take_over=getattr(args, "take_over", False),
        )

    def _ended(self, study, args, outcome) -> int:
        """The study's summary, then what its outcome says and its exit status."""
        try:
            summary.print_summary(study, outcome.tracking_uri, outcome)
        except (Exception, KeyboardInterrupt) as err:  # noqa: BLE001 - the study's records are complete either way
            what = "interrupted" if isinstance(err, KeyboardInterrupt) else f"failed ({type(err).__name__}: {err})"
            print(
                f"\nsharpscale: the study's runs are recorded and closed ({outcome.trials} trials); printing its summary "
                f"{what}. `{shell_command(prog(), 'status', args.study)}` shows it.",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED if isinstance(err, KeyboardInterrupt) else EXIT_ERRORS
        if outcome.interrupted:
            print(incomplete(args, f"after {outcome.trials} of {study.total_trials} trials"), file=sys.stderr)
            return EXIT_INTERRUPTED
        if outcome.nothing_ran:
            print(
                f"sharpscale: no trial ran a single epoch ({outcome.trials} started): the study has no result and its "
                f"MLflow run is marked FAILED. Fix: a longer budget.time_limit_s (or none), then `sharpscale run "
                f"--new-launch {args.study}`.",
                file=sys.stderr,
            )
            return EXIT_ERRORS
        if outcome.errored:
            refused = (
                f" ({outcome.refused} refused by their settings inside the trial, failed once without retries)"
                if outcome.refused
                else ""
            )
            print(
                f"sharpscale: {outcome.errored} trial(s) errored after their retries{refused}; see `sharpscale status` "
                f"and the runs' {REASON_TAG} tags",
                file=sys.stderr,
            )
        return EXIT_ERRORS if outcome.trials == 0 or outcome.errored else 0


class Resume(Run):
    name = "resume"
    help = (
        "finish an interrupted study: finished trials are not re-run, no run is duplicated; its state is where "
        "the interrupted run recorded it"
    )
    resumes = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("study", help="the study file that was run")
        parser.add_argument(
            "--trust-storage",
            action="store_true",
            help="restore Tune's state files (which Tune unpickles) even where they are not the ones this launch recorded "
            "leaving (its driver was killed hard, or its node lost): only where no one else can write to the storage",
        )
        parser.add_argument(
            "--take-over",
            action="store_true",
            help="take the launch's driver claim from the driver that holds it, on another host, known to be gone (its "
            "machine lost); a driver that ended on this host is taken over without it",
        )
        parser.set_defaults(dry_run=False)


class Validate(Command):
    name = "validate"
    help = f"check a study file: exit 0 when valid, {EXIT_USAGE} listing every problem"
    epilog = f"Exit status: 0 when the study is valid; {EXIT_USAGE} when it is not (every problem listed, one a line)."
    options = (study_options,)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("study")

    def take_action(self, args) -> int:
        from studies.spec import load_study

        study = load_study(args.study, smoke=args.smoke, overrides=overrides(args))
        print(f"{args.study}: valid. {len(study.cells)} cells, {study.total_trials} trials.")
        optuna = study.optuna_storage(study.experiment_name)
        print(f"State: Ray storage {study.storage}, Optuna {optuna} (a resumed run keeps its recorded ones).")
        return 0


class Calibrate(Command):
    name = "calibrate"
    help = "measure how many trials of the study should share one GPU (resources.gpus_per_trial), on this machine's GPU"
    description = (
        "Train 1, 2, ... copies of each distinct trial of the study at once on this machine's first GPU "
        "(synthetic data on the device, the cell's model, method, batch and image size, two short epochs) and print "
        "their aggregate images/s; recommends the largest count whose every added trial raised it by at least 10%, "
        "as resources.gpus_per_trial = 1/count. Run it on a node with the card the study will run on."
    )
    options = (study_options,)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("study")
        parser.add_argument(
            "--cell", action="append", default=[], help="only this cell (repeatable; default: every distinct one)"
        )
        parser.add_argument("--max-shares", type=int, default=4, help="most trials tried on one GPU (default 4)")
        parser.add_argument("--steps", type=int, default=30, help="steps of each measured epoch (default 30)")
        parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)

    def take_action(self, args) -> int:
        from studies.calibrate import calibrate, probe_config
        from studies.spec import load_study

        study = load_study(args.study, smoke=args.smoke, overrides=overrides(args), require_data=False)
        cells = [c for c in study.cells if not args.cell or c.key in args.cell]
        if args.cell and len(cells) != len(set(args.cell)):
            known = ", ".join(c.key for c in study.cells)
            raise UserError(
                f"calibrate --cell: {sorted(set(args.cell) - {c.key for c in cells})} not cells of the study "
                f"(its cells: {known}). Fix: name cells as `sharpscale run --dry-run` lists them."
            )
        # One measurement per distinct probe: cells that differ only in seeds or searched knobs train alike.
        probes: dict[str, str] = {}
        for c in cells:
            key = repr(sorted(probe_config(c.config, device=args.device, steps=args.steps).items()))
            probes.setdefault(key, c.key)
        results = []
        for c in cells:
            if c.key not in probes.values():
                continue
            result = calibrate(c.config, cell=c.key, max_shares=args.max_shares, steps=args.steps, device=args.device)
            results.append(result)
            for line in result.lines():
                print(line, flush=True)
        fewest = min(results, key=lambda r: r.shares)
        if len(results) > 1:
            print(
                f"\nFor the study (every trial shares alike, so the cell that gains least from sharing decides): "
                f"resources.gpus_per_trial: {fewest.gpus_per_trial:g} (cell {fewest.cell})."
            )
        return 0


def _print_cells(study) -> None:
    from trainables.naming import cell_name

    names = [cell_name(c.levels) for c in study.cells]
    width = max((len(n) for n in names), default=4)
    confirm = study.spec.confirm is not None
    print(f"{'cell':<{width}}  trials  {'confirm  ' if confirm else ''}searched")
    for c, name in zip(study.cells, names):
        space = ", ".join(f"{p} ~ {d.type}" for p, d in c.space.items()) or "-"
        print(f"{name:<{width}}  {c.trials:>6}  {f'{c.confirm:>7}  ' if confirm else ''}{space}")
    print(f"{len(study.cells)} cells, {study.total_trials} trials")


def _print_estimate(study, args) -> None:
    """The study's GPU-hours from measured figures, on the card of the cluster it would run on where known here."""
    from studies.cost import estimate_study, local_gpus

    if getattr(args, "address", None):
        gpus, card, cpus = None, None, None  # a cluster elsewhere: its cards are not known without connecting
    else:
        (gpus, card), cpus = local_gpus(), getattr(args, "num_cpus", None) or os.cpu_count()
    for line in estimate_study(study, gpus=gpus, cluster_card=card, cpus=cpus).lines():
        print(line)


def starting_line(args, *, resumes: bool) -> str:
    """The line `run` and `resume` print at once, before the silent start of Ray: what happens and how long."""
    verb = "resuming" if resumes else "running"
    if args.address:
        return f"sharpscale: {verb} {args.study} on the Ray cluster at {args.address}: connecting..."
    return f"sharpscale: {verb} {args.study}: starting Ray, about 40-50 s..."


def incomplete(args, when: str) -> str:
    """What an interrupted study tells its user: it is incomplete, and the command that finishes it."""
    resume = [prog(), "resume", args.study]
    for item in getattr(args, "set", None) or []:
        resume += ["--set", item]
    for flag in ("storage", "tracking_uri", "address"):
        if getattr(args, flag, None):
            resume += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
    if getattr(args, "smoke", False):
        resume.append("--smoke")
    return (
        f"sharpscale: study interrupted {when}: it is INCOMPLETE (its MLflow runs are marked KILLED, interrupted "
        f"trials 'interrupted'). Finish it with:\n  {shell_command(*resume)}"
    )
