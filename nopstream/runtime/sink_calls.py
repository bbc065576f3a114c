"""Sink I/O of one subtask: every call in a thread of its own, one at a time, bounded in time.

A sink's calls (prepare at a barrier, commit on the coordinator's command, recover at
the start of a run) do network I/O that must never hold the task's event loop, and a
commit command arrives while the record loop runs: a lock keeps the calls of both in
order. A call that fails or hangs fails the task (the job recovers from its durable
epoch) rather than leave it waiting on a sink that cannot go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from nopstream.records import SinkState
from nopstream.runtime.operators.sinks import SinkOperator

T = TypeVar("T")


class SinkStuck(RuntimeError):
    """A sink call did not return in time: the task fails (and its job recovers) rather than wait."""


class SinkCalls:
    """The sinks of one subtask's chain, called through `each` and `prepare`."""

    def __init__(
        self,
        sinks: Sequence[SinkOperator],
        *,
        task_id: str,
        limit_s: float,
        on_failure: Callable[[BaseException], None],
    ) -> None:
        """`on_failure` learns of a call that failed or timed out (before the caller does)."""
        self.sinks = tuple(sinks)
        self._task_id = task_id
        self._limit_s = limit_s
        self._on_failure = on_failure
        self._lock = asyncio.Lock()

    async def each(self, call: Callable[[SinkOperator], None]) -> None:
        """`call` on every sink in turn, after any call under way."""
        if not self.sinks:
            return
        async with self._lock:
            for sink in self.sinks:
                await self._call(call, sink)

    async def prepare(self, epoch: int, then: Callable[[], T]) -> T:
        """Every sink prepares its transaction of `epoch`; `then()` is taken before another call
        can change their pending transactions (the task's snapshot)."""
        async with self._lock:
            for sink in self.sinks:
                await self._call(lambda s: s.prepare(epoch), sink)
            return then()

    def pending_transactions(self) -> int:
        """Transactions prepared and not yet committed, over every sink."""
        return sum(len(SinkState.from_json(s.writer.snapshot()).pending) for s in self.sinks)

    async def _call(self, call: Callable[[SinkOperator], None], sink: SinkOperator) -> None:
        try:
            async with asyncio.timeout(self._limit_s):
                await in_daemon_thread(lambda: call(sink))
        except TimeoutError:
            faulthandler.dump_traceback(all_threads=True)  # where it hangs, into the task's log
            stuck = SinkStuck(f"task {self._task_id}: a sink call did not return within {self._limit_s:g} s")
            self._on_failure(stuck)
            raise stuck from None
        except Exception as exc:
            self._on_failure(exc)
            raise


def in_daemon_thread(fn: Callable[[], None]) -> asyncio.Future[None]:
    """`fn()` in a daemon thread of its own, as a future of this loop.

    Not the loop's executor: its threads are joined when the process exits, so a client
    library call that never returns would keep a failed task's process alive.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(failure: BaseException | None) -> None:
        if done.cancelled():
            return
        if failure is None:
            done.set_result(None)
        else:
            done.set_exception(failure)

    def target() -> None:
        failure: BaseException | None = None
        try:
            fn()
        except BaseException as exc:  # handed to the awaiting coroutine
            failure = exc
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(settle, failure)

    threading.Thread(target=target, name="sink-call", daemon=True).start()
    return done
