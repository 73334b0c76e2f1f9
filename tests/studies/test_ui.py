"""`sharpscale ui`: a real MLflow UI on loopback over the store, gone without a trace after Ctrl-C."""

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from studies.server import free_port, group_alive


@pytest.mark.timeout(180)
def test_ui_serves_and_ctrl_c_leaves_no_server(tmp_path, tracking_uri):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "studies.cli", "ui", "--tracking-uri", tracking_uri, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        status = None
        while time.time() < deadline:
            try:
                status = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).status
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(1)
        assert status == 200
        # The server runs in its own process group, below the launcher.
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert children
        server_pgid = os.getpgid(int(children[0]))
        assert server_pgid != os.getpgid(proc.pid)

        proc.send_signal(signal.SIGINT)  # what Ctrl-C delivers to the launcher
        assert proc.wait(timeout=30) == 0
        deadline = time.time() + 20
        while group_alive(server_pgid) and time.time() < deadline:
            time.sleep(0.5)
        assert not group_alive(server_pgid), "MLflow server processes survived Ctrl-C"
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
    finally:
        if proc.poll() is None:
            # A failed assertion must not leave the server behind: it runs in its own process group below the launcher.
            for child in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split():
                try:
                    os.killpg(os.getpgid(int(child)), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os.killpg(proc.pid, signal.SIGKILL)
