"""The engine's subscribers: one bounded asyncio queue each for snapshots and events; when a queue is full the
oldest item is dropped (subscribers want the newest state) and counted in the engine's counters."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from .counters import EngineCounters

__all__ = ["Fanout"]


class Fanout:
    """Hands each item to every subscriber of its kind ("snapshots" or "events") without waiting for any."""

    def __init__(self, counters: EngineCounters, queue_size: int) -> None:
        self.counters, self.queue_size = counters, queue_size
        self.queues: dict[str, list[asyncio.Queue[Any]]] = {"snapshots": [], "events": []}

    def offer(self, kind: str, item: Any) -> None:
        for q in self.queues[kind]:
            if q.full():
                q.get_nowait()  # drop the oldest
                q.task_done()
                counter = f"{kind}_dropped"
                setattr(self.counters, counter, getattr(self.counters, counter) + 1)
            q.put_nowait(item)

    async def subscribe(self, kind: str, timeout_s: float | None) -> AsyncIterator[Any]:
        """Every item of this kind from now on; ends after timeout_s without one."""
        q: asyncio.Queue[Any] = asyncio.Queue(self.queue_size)
        self.queues[kind].append(q)
        try:
            while True:
                yield await asyncio.wait_for(q.get(), timeout_s)
                q.task_done()  # the subscriber came back for the next one: it is done with this one
        except TimeoutError:
            return
        finally:
            self.queues[kind].remove(q)

    async def drained(self) -> None:
        """Until every subscriber has taken, and come back after, each item handed to it so far."""
        await asyncio.gather(*(q.join() for qs in self.queues.values() for q in qs))

    def depths(self) -> dict[str, int]:
        """Items waiting per queue, named engine_snapshots_K and engine_events_K."""
        return {f"engine_{kind}_{k}": q.qsize() for kind, qs in self.queues.items() for k, q in enumerate(qs)}
