"""The runner's one-line progress display on a terminal."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import TextIO

from nopstream.plan.partitioned import PartitionedPlan


class Progress:
    """A one-line progress display on a terminal: records/s in and out per vertex, watermarks."""

    def __init__(
        self,
        plan: PartitionedPlan,
        sample: Callable[[], dict[str, tuple[int, int, int | None]]],
        *,
        out: TextIO | None,
        quiet: bool,
    ) -> None:
        """Show `plan`'s vertices from what `sample` gives (task id: records in, out, watermark) on
        `out` (stderr when a terminal, if None), unless `quiet`."""
        self.plan = plan
        self.sample = sample
        self.out = out if out is not None else sys.stderr
        self.enabled = not quiet and (out is not None or sys.stderr.isatty())
        self._last: dict[str, tuple[int, int]] = {}
        self._shown = False

    async def loop(self) -> None:
        """Show the rates every second until cancelled."""
        if not self.enabled:
            return
        last_time = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            self.show(now - last_time)
            last_time = now

    def show(self, elapsed: float) -> None:
        """Show the rates over the last `elapsed` seconds."""
        counts = self.sample()
        parts = []
        for v in self.plan.vertices:
            rin = sum(counts.get(s.task_id, (0, 0, None))[0] for s in v.subtasks)
            rout = sum(counts.get(s.task_id, (0, 0, None))[1] for s in v.subtasks)
            marks = [counts.get(s.task_id, (0, 0, None))[2] for s in v.subtasks]
            before = self._last.get(v.vertex_id, (0, 0))
            self._last[v.vertex_id] = (rin, rout)
            rate_in, rate_out = (rin - before[0]) / elapsed, (rout - before[1]) / elapsed
            text = f"{v.vertex_id} in {rate_in:,.0f}/s out {rate_out:,.0f}/s"
            if any(m is not None for m in marks):
                text += f" wm {min(m for m in marks if m is not None)}"
            parts.append(text)
        self.out.write("\r" + " | ".join(parts) + "\x1b[K")
        self.out.flush()
        self._shown = True

    def done(self) -> None:
        """End the line, if one was shown."""
        if self._shown:
            self.out.write("\n")
            self.out.flush()
