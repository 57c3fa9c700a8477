"""Pausing Python's cycle collector around work that builds many small objects and no garbage
cycles (trace reading, a simulation and its report): its repeated scans of the growing heap would
cost more than the work, and the objects die by reference counting anyway."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_collector() -> Iterator[None]:
    """The collector off inside the block, back as it was after (also on errors)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
