"""`sharpscale ui`: a real MLflow UI on loopback over the store, gone without a trace after Ctrl-C."""

import os
import signal
import subprocess
import time
import urllib.request

import pytest

from studies.server import free_port, group_alive, pids_in_groups, pids_naming


def _answers(url: str) -> int | None:
    """The HTTP status of `url`, or None while nothing answers there."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except OSError:
        return None


@pytest.mark.timeout(180)
def test_ui_serves_and_ctrl_c_leaves_no_server(tmp_path, tracking_uri, cli_process):
    port = free_port()
    proc = cli_process.start("ui", "--tracking-uri", tracking_uri, "--port", port)
    status = cli_process.wait_for(
        proc, lambda: _answers(f"http://127.0.0.1:{port}/"), timeout=120, what="the UI answering", every=1
    )
    assert status == 200
    # The server runs in its own process group, below the launcher.
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert children
    server_pgid = os.getpgid(int(children[0]))
    assert server_pgid != os.getpgid(proc.pid)
    # No MLflow job runner beside it (studies.server: sharpscale submits no MLflow jobs).
    assert not set(pids_in_groups({server_pgid})) & pids_naming("mlflow.server.jobs")

    proc.send_signal(signal.SIGINT)  # what Ctrl-C delivers to the launcher
    assert proc.wait(timeout=30) == 0
    deadline = time.time() + 20
    while group_alive(server_pgid) and time.time() < deadline:
        time.sleep(0.5)
    assert not group_alive(server_pgid), "MLflow server processes survived Ctrl-C"
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
