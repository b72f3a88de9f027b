"""Ending processes we started, by pid: SIGTERM, then SIGKILL what is left, and reap.

Ray's processes sit on SIGTERM for 10 s and more; whoever stops them has already saved what matters
(jobs backed up, a VM deleted), so the grace is short.
"""

from __future__ import annotations

import signal

import psutil

STOP_GRACE_S = 2.0


def end(procs: list[psutil.Process], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM `procs`, SIGKILL whatever is left after `grace_s`, and wait for them."""
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
