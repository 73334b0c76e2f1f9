"""The `sharpscale` command as a user meets it: exit codes and messages, never a traceback for a user mistake."""

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def sharpscale(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "studies.cli", *args], capture_output=True, text=True, cwd=cwd or REPO, timeout=120
    )


def test_validate_good_file():
    out = sharpscale("validate", "studies/quickstart.yaml")
    assert out.returncode == 0, out.stderr
    assert "valid" in out.stdout and "trials" in out.stdout


def test_validate_bad_file_lists_problems_without_traceback(tmp_path):
    bad = yaml.safe_load((REPO / "studies" / "quickstart.yaml").read_text())
    bad["base"]["schedule"]["epochs"] = -1
    bad["factors"]["method"]["sam"]["optimizer.method"] = "smа"
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(bad, sort_keys=False))
    out = sharpscale("validate", str(p))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "schedule.epochs" in out.stderr and "optimizer.method" in out.stderr
    assert "problem(s)" in out.stderr


def test_dry_run_prints_cells_and_counts():
    out = sharpscale("run", "--dry-run", "studies/quickstart.yaml")
    assert out.returncode == 0, out.stderr
    assert "\nvit/sam " in out.stdout  # the cell's one name, as status and the trial runs name it
    assert "arch=vit,method=sam" not in out.stdout
    assert "optimizer.hparams.rho ~ loguniform" in out.stdout
    assert "6 cells, 15 trials" in out.stdout


def test_help_lists_commands():
    out = sharpscale("--help")
    assert out.returncode == 0
    for cmd in ("run", "validate", "ui"):
        assert cmd in out.stdout


def test_read_only_commands_need_no_data_but_validate_and_run_do(tmp_path, capsys):
    # In-process (the CLI's own main): four commands without four interpreter start-ups.
    from studies.cli import main

    # rho_sensitivity reads CIFAR-10 from data.root, which this machine does not have.
    study = str(REPO / "studies" / "rho_sensitivity.yaml")
    missing = ["--set", f"data.root={tmp_path / 'no-cifar'}", "--storage", str(tmp_path / "runs")]
    assert main(["run", "--dry-run", study, *missing]) == 0
    assert "\nvit/sam " in capsys.readouterr().out
    main(["status", study, *missing, "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    assert "data.root" not in capsys.readouterr().err  # it may find no experiment, but never asks for the data
    for command in ("validate", "run"):
        assert main([command, study, *missing]) == 2
        assert "data.root: the directory must exist" in capsys.readouterr().err


def test_dashboard_without_a_recorded_run_says_what_to_do(tmp_path, capsys):
    from studies.cli import main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["dashboard", str(REPO / "studies" / "quickstart.yaml"), "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert "no study run recorded" in err and "sharpscale run" in err and "Traceback" not in err


def test_dashboard_without_optuna_dashboard_is_a_users_fix_pinned_as_the_project_pins(monkeypatch, tmp_path, capsys):
    # The package is a dependency of the project: the fix installs it under the project's constraints, said as
    # every user error is (one line, EXIT_USAGE), before the study or its store is read.
    from studies.cli import EXIT_USAGE, main

    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)  # importing it raises ImportError
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["dashboard", str(tmp_path / "no-such-study.yaml"), "--tracking-uri", uri]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert (
        err.startswith("sharpscale: error: sharpscale dashboard needs optuna-dashboard") and len(err.splitlines()) == 1
    )
    assert "pip install -c constraints.txt ." in err and "Traceback" not in err
    assert not (tmp_path / "mlflow.db").exists()


def test_tracking_uri_is_explained_under_status_and_ui(capsys):
    import pytest

    from studies.cli import main

    for command in ("status", "ui"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--tracking-uri" in text and "MLflow" in text and "sqlite:///mlflow.db" in text


def test_ui_address_is_printed_once_it_answers(capsys):
    import http.server
    import threading
    import time

    from studies.cli.servers import _say_when_answering
    from studies.server import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    _say_when_answering(url, f"UI: {url}", path="/", timeout_s=60)
    time.sleep(1.0)  # nothing listens yet: nothing may be printed
    assert "UI:" not in capsys.readouterr().out
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        deadline = time.monotonic() + 30
        out = ""
        while "UI:" not in out and time.monotonic() < deadline:
            time.sleep(0.2)
            out += capsys.readouterr().out
        assert out.count(f"UI: {url}") == 1
    finally:
        server.shutdown()


def test_the_quiet_environment_lasts_for_the_command_only(monkeypatch, tmp_path):
    import os

    from studies import cli
    from studies.cli.study import Validate

    for key in cli.QUIET_ENV:
        monkeypatch.delenv(key, raising=False)
    seen = {}
    monkeypatch.setattr(
        Validate, "take_action", lambda self, args: seen.update({k: os.environ.get(k) for k in cli.QUIET_ENV}) or 0
    )
    assert cli.main(["validate", str(tmp_path / "study.yaml")]) == 0
    assert seen == cli.QUIET_ENV  # Ray and MLflow started by the command see it
    assert not [key for key in cli.QUIET_ENV if key in os.environ]  # the caller's environment is as it was


def test_every_command_the_readme_shows_parses():
    # The examples moved from the README to docs/cli.md, the page the README links for the commands.
    import re
    import shlex

    from studies.cli import build_parser

    readme = (REPO / "docs" / "cli.md").read_text()
    block = readme.split("## The `sharpscale` command", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    commands = [
        shlex.split(re.sub(r"STUDY\.yaml", "studies/quickstart.yaml", line[3:]))
        for line in lines
        if line.startswith("$S ")
    ]
    assert len(commands) >= 10, commands  # the block was found and read
    parser = build_parser()
    for args in commands:
        parser.parse_args(args)  # argparse exits 2 on an option or command the CLI no longer has


def test_the_readmes_next_commands_are_what_make_demo_prints(monkeypatch):
    # `make demo` runs $(BIN)/sharpscale, so the commands it prints to go on with start with that path (`_prog`);
    # the README's quickstart block (docs/update_readme.py) shows them so, as its other commands do ($S).
    import importlib.util
    import re

    from studies.cli import base

    make = (REPO / "Makefile").read_text()
    venv_bin = re.search(r"^BIN\s*:=\s*\$\(VENV\)/bin", make, re.MULTILINE) and re.search(
        r"^VENV\s*:=\s*(\S+)", make, re.MULTILINE
    )
    assert venv_bin and re.search(r"^demo:.*\n\t\$\(BIN\)/sharpscale run ", make, re.MULTILINE)
    prog = f"{venv_bin[1]}/bin/sharpscale"
    spec = importlib.util.spec_from_file_location("update_readme", REPO / "docs" / "update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.DEMO_PROG == prog
    readme = (REPO / "README.md").read_text()
    block = readme.split(module.BEGIN, 1)[1].split(module.END, 1)[0]
    nexts = block.split("Next:", 1)[1].split("```", 1)[0].strip("\n").splitlines()
    assert len(nexts) == 3 and all(line.startswith(f"  {prog} ") for line in nexts), nexts
    assert f"{prog} ui" in readme.split(module.END, 1)[1]  # the prose after the block says the same
    monkeypatch.setattr(base.sys, "argv", [str(Path.cwd() / prog)])
    assert base.prog() == prog


def test_an_empty_or_variable_location_flag_is_refused_before_anything_runs(tmp_path, capsys):
    # Before: --tracking-uri '' fell back to the study's tracking.uri, and --storage '' made the study's own
    # folder its storage, without a word.
    import pytest

    from studies.cli import main

    study = str(REPO / "studies" / "quickstart.yaml")
    for argv, flag in [
        (["status", study, "--tracking-uri", ""], "--tracking-uri"),
        (["validate", study, "--storage", " "], "--storage"),
        (["ui", "--tracking-uri", ""], "--tracking-uri"),
        (["run", "--dry-run", study, "--storage", "$SCRATCH/runs"], "--storage"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {flag}:" in err and "Fix:" in err, err
        assert "must name a directory or URI" in err or "is a shell variable that is not expanded" in err
