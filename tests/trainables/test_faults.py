"""What a trial process that dies of a fault leaves in its log."""

import subprocess
import sys
import textwrap


def test_a_fault_in_a_trial_process_dumps_the_stack_of_every_thread():
    # A trial process that dies of a segmentation fault must say what each of its threads was doing (the trial's, a
    # previous trial's still ending, the loader's), not only the faulting one: trainables.ray_train enables that.
    code = textwrap.dedent(
        """
        import faulthandler, threading
        from trainables.ray_train import dump_every_thread_on_fault

        dump_every_thread_on_fault()
        running, never = threading.Event(), threading.Event()

        def other_thread_waiting_here():
            running.set()
            never.wait()

        threading.Thread(target=other_thread_waiting_here, daemon=True).start()
        running.wait()
        faulthandler._sigsegv()
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "Segmentation fault" in done.stderr
    assert "other_thread_waiting_here" in done.stderr  # the thread that did not fault
    assert done.stderr.count("Thread 0x") + done.stderr.count("Current thread 0x") >= 2
