"""Shared reads of a cluster: identical reads that overlap in time make one call, and a result stays
good for a short while (`ttl_s`, a second by default).

Why: 50 people typing `/jobs local` at once would otherwise read the dashboard 50 times, each in its
own thread, and that work competes with the acknowledgements still queued (issue 10). A read that
fails is not kept: every caller waiting on it gets the same exception, and the next caller reads
again.

Two doors onto the same cache, for the two kinds of callers:
- `get(key, fn, *args)`: blocking and thread-safe (the bot's `asyncio.to_thread` calls, the CLI);
- `await aget(key, fn, *args)`: for coroutines on one event loop (`fn` returns an awaitable); the
  waiters share one task, so a caller that gives up (cancelled) does not cancel the read for others.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Hashable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class SharedReads:
    def __init__(self, ttl_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s < 0:
            raise ValueError("ttl_s must be >= 0")
        self.ttl_s = ttl_s
        self._clock = clock
        self._mutex = threading.Lock()
        self._fresh: dict[Hashable, tuple[float, Any]] = {}  # key -> (read at, result)
        self._flying: dict[Hashable, Future[Any]] = {}
        self._aflying: dict[Hashable, asyncio.Task[Any]] = {}
        self.calls = 0  # reads actually made (what the tests and the bench count)

    def _cached(self, key: Hashable) -> tuple[bool, Any]:
        hit = self._fresh.get(key)
        if hit is not None and self._clock() - hit[0] < self.ttl_s:
            return True, hit[1]
        return False, None

    def peek(self, key: Hashable) -> tuple[bool, Any]:
        """(True, the result) when a read of `key` finished less than ttl_s ago; (False, None) otherwise.
        Never reads: for a caller that answers at once when it can and acknowledges first when not."""
        with self._mutex:
            return self._cached(key)

    def _keep(self, key: Hashable, started: float, value: Any) -> None:
        # Stamped with when the read started: a slow read is no fresher than the moment it looked.
        with self._mutex:
            self._fresh[key] = (started, value)

    def get(self, key: Hashable, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)`, or the result of the identical read in flight or done less than ttl_s ago."""
        with self._mutex:
            ok, value = self._cached(key)
            if ok:
                return value
            flying = self._flying.get(key)
            leader = flying is None
            if leader:
                flying = self._flying[key] = Future()
                self.calls += 1
        assert flying is not None
        if not leader:
            return flying.result()
        started = self._clock()
        try:
            value = fn(*args)
        except BaseException as e:
            with self._mutex:
                del self._flying[key]
            flying.set_exception(e)
            raise
        self._keep(key, started, value)
        with self._mutex:
            del self._flying[key]
        flying.set_result(value)
        return value

    async def aget(self, key: Hashable, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`await fn(*args)`, shared the same way among the coroutines of one event loop."""
        with self._mutex:
            ok, value = self._cached(key)
            if ok:
                return value
            task = self._aflying.get(key)
            if task is None:
                self.calls += 1
                task = self._aflying[key] = asyncio.ensure_future(self._aread(key, fn, *args))
        return await asyncio.shield(task)

    async def _aread(self, key: Hashable, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        started = self._clock()
        try:
            value = await fn(*args)
            self._keep(key, started, value)
            return value
        finally:
            with self._mutex:
                self._aflying.pop(key, None)

    def forget(self, key: Hashable | None = None) -> None:
        """Drop what is kept (for `key`, or all): the next read reads again (say, after a change we made)."""
        with self._mutex:
            if key is None:
                self._fresh.clear()
            else:
                self._fresh.pop(key, None)
