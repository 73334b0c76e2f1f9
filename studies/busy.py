"""How busy a study kept its GPUs: NVML's utilisation of the driver's node's GPUs, sampled while the trials run."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

__all__ = ["BUSY_METRIC", "SAMPLE_MS", "GpuBusySampler", "nvidia_smi_command"]

# The study run's metric: the mean over samples and GPUs of NVML's `utilization.gpu` / 100, i.e. the share of time in
# which at least one kernel ran on a GPU (nvidia-smi's definition: of each sample period, the share in which "one or
# more kernels was executing"). It says nothing of how much of the GPU a kernel used; 1.0 is every GPU always running
# something. Beside it, training_share_of_held_gpu_time counts the trials' training passes instead.
BUSY_METRIC = "gpu_busy_fraction"
# nvidia-smi's sampling period while a study runs.
SAMPLE_MS = 500


def nvidia_smi_command(environ: dict[str, str] | None = None, interval_ms: int = SAMPLE_MS) -> list[str] | None:
    """The nvidia-smi command that prints, every `interval_ms`, one utilisation line per GPU this process may use
    (CUDA_VISIBLE_DEVICES where set: what Ray hands its trials on this node); None without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    env = os.environ if environ is None else environ
    command = [exe, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", f"-lms={interval_ms}"]
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible:
        command.insert(1, f"--id={visible}")
    return command


class GpuBusySampler:
    """Runs `command` (nvidia_smi_command's by default) while a study runs and averages the numbers it prints, one a
    line (a percentage); lines that are not a number ("[N/A]", a warning) are skipped and counted.

    `start()` is False where there is no command (no nvidia-smi on this node) or it cannot start; `stop()` ends it and
    returns the busy fraction (mean / 100), None where no sample was read.
    """

    def __init__(self, command: list[str] | None = None):
        self.command = command if command is not None else nvidia_smi_command()
        self.samples: list[float] = []
        self.skipped = 0
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> bool:
        if not self.command:
            return False
        try:
            self._proc = subprocess.Popen(
                self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
            )
        except OSError:
            return False
        self._reader = threading.Thread(target=self._read, name="gpu-busy-sampler", daemon=True)
        self._reader.start()
        return True

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                self.samples.append(float(line.strip()))
            except ValueError:
                self.skipped += bool(line.strip())

    def wait(self, timeout: float | None = None) -> None:
        """Until the command has ended by itself and every line it printed is read (a finite command)."""
        if self._proc is not None:
            self._proc.wait(timeout=timeout)
        if self._reader is not None:
            self._reader.join(timeout=timeout)

    def stop(self) -> float | None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=10)
        return self.fraction

    @property
    def fraction(self) -> float | None:
        return sum(self.samples) / (100.0 * len(self.samples)) if self.samples else None
