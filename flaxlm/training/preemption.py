"""Stopping on SIGTERM / SIGINT without losing work: the loop finishes its step, saves and exits 0.

Preemptible TPU VMs and cluster schedulers send SIGTERM some seconds before the kill; Ctrl-C sends
SIGINT. The first signal only sets a flag that the training loop reads after each step; a second one
exits at once. On a multi-host run every process learns of a signal any process got (a tiny all-gather
per step), so all of them save the same step.
"""
import os
import signal
import sys
import threading

import jax
import numpy as np

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(SystemExit):
    """The run stopped on a signal after saving a checkpoint: a clean exit (code 0), not an error."""

    def __init__(self):
        super().__init__(0)


class StopOnSignal:
    """Context manager whose `requested()` turns true (on every process) once any process got a signal.

        with StopOnSignal() as stop:
            for step in ...:
                train_step(...)
                if stop.requested():
                    save(); raise Preempted()
    """

    def __init__(self):
        self.signum = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # Python allows handlers only there
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
        return False

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.signum is not None:
            print(f"\n{name} again: exiting now, without saving", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.signum = signum
        print(f"\n{name}: finishing this step, then saving a checkpoint and exiting ({name} again exits at once)",
              file=sys.stderr, flush=True)

    def requested(self):
        """True when this process or (multi-host) any process got a signal; all processes agree per step."""
        local = self.signum is not None
        if jax.process_count() == 1:
            return local
        from jax.experimental import multihost_utils
        return bool(np.max(multihost_utils.process_allgather(np.int32(local))))

    @property
    def name(self):
        return signal.Signals(self.signum).name if self.signum is not None else "a signal on another host"
