"""Change feed: the coordinator's condition variable, which also tells subscribers.

Every state change that an agent's watch may need to hear about (a job created or ended, a
new topology version, leadership gained or lost) calls ``notify_all`` under the coordinator
lock. Threads waiting on the condition wake as usual; each subscriber (the asyncio watch hub)
is called too and must not block: it only schedules work on its own loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class ChangeFeed(threading.Condition):
    def __init__(self, lock: threading.RLock) -> None:
        super().__init__(lock)
        self.generation = 0  # bumped by every change
        self._subscribers: list[Callable[[], None]] = []

    def subscribe(self, callback: Callable[[], None]) -> None:
        with self:
            self._subscribers.append(callback)

    def unsubscribe(self, callback: Callable[[], None]) -> None:
        with self:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

    def notify_all(self) -> None:
        super().notify_all()
        self.generation += 1
        for callback in self._subscribers:
            callback()


__all__ = ["ChangeFeed"]
