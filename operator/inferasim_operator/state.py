"""What this operator process remembers about each tuning between passes (never written anywhere).

The status holds what must survive a restart; this memo holds what may be lost with the process:
the lock that keeps two passes of one tuning apart, when its workload was last observed, when a
failed timer pass may run again, which ServingAnchors it was already re-tuned for and how many
timer passes in a row failed. A restart starts each of them afresh, which is safe: a drift check
runs early, a backoff ends early, a new anchor re-tunes at most once more.
"""

from __future__ import annotations

import asyncio
import time

from inferasim_operator import metrics


class TuningMemo:
    """Per-tuning memory, keyed by the tuning's uid."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._last_observe: dict[str, float] = {}
        self._next_attempt: dict[str, float] = {}
        self._retuned_for: dict[str, set[str]] = {}
        self._timer_failures: dict[str, int] = {}

    def lock(self, uid: str) -> asyncio.Lock:
        """The tuning's lock: one pass (reconcile or timer) at a time writes its status."""
        return self._locks.setdefault(uid, asyncio.Lock())

    def tunings(self) -> int:
        """How many tunings this process has handled (the liveness probe shows it)."""
        return len(self._locks)

    # observation (the drift check's clock)

    def observed(self, uid: str) -> None:
        """The tuning's workload was observed just now."""
        self._last_observe[uid] = time.monotonic()

    def since_observed(self, uid: str) -> float | None:
        """Seconds since the tuning's workload was last observed; None when never in this process."""
        last = self._last_observe.get(uid)
        return None if last is None else time.monotonic() - last

    # the timer's backoff

    def retry_at(self, uid: str, when: float) -> None:
        """The timer leaves the tuning alone until ``when`` (time.monotonic() seconds)."""
        self._next_attempt[uid] = when

    def backing_off(self, uid: str) -> bool:
        return time.monotonic() < self._next_attempt.get(uid, 0.0)

    def timer_failed(self, uid: str) -> int:
        """Count one more timer pass that raised; returns how many in a row (their backoff)."""
        self._timer_failures[uid] = self._timer_failures.get(uid, 0) + 1
        return self._timer_failures[uid]

    def timer_recovered(self, uid: str) -> bool:
        """A timer pass completed: True when earlier ones had failed (their Degraded is to be lifted)."""
        return bool(self._timer_failures.pop(uid, None))

    # anchors a tuning was re-tuned for

    def retuned_for(self, uid: str) -> set[str]:
        """ServingAnchors (name@resourceVersion) the tuning was already re-tuned for; the caller adds to it."""
        return self._retuned_for.setdefault(uid, set())

    def forget(self, uid: str) -> None:
        for d in (self._locks, self._last_observe, self._next_attempt, self._retuned_for, self._timer_failures):
            d.pop(uid, None)


# One memo per operator process: the kopf handlers and the passes they start share it.
MEMO = TuningMemo()


def forget(uid: str) -> None:
    """A tuning was deleted: its memo and its metrics' series go."""
    MEMO.forget(uid)
    metrics.forget(uid)
