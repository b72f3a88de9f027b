"""The simulator's clock: one thread that runs scheduled transitions and hook calls when they are due.

Transitions wait on a condition variable until the next due time (no polling); `stop()` ends the thread.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Clock:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="tpu-sim-clock", daemon=True)
        self._thread.start()

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> None:
        """Run `fn` on the clock thread after `delay_s` seconds (0: as soon as the thread is free)."""
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + max(0.0, delay_s), next(self._seq), fn))
            self._cond.notify()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread; what was scheduled and not yet due is dropped."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(wait)
                if self._stopped:
                    return
                _, _, fn = heapq.heappop(self._heap)
            try:
                fn()
            except Exception:  # a failing hook or transition must not stop the clock
                log.exception("tpu-sim: scheduled call failed")
