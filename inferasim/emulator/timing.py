"""A virtual clock and an event loop whose timers fire within tens of microseconds.

Why: the emulator runs `--speedup X` times faster than the engine it imitates, so an engine step
of 7 ms lasts 0.35 ms of real time at X = 20. asyncio's default epoll selector rounds every wait
up to a whole millisecond (epoll_wait takes milliseconds), which would add about 10-20 ms of
emulated lateness to every token at X = 20. `PreciseEpollSelector` waits on the epoll descriptor
itself with select(2), whose timeout has microsecond resolution, then collects the events with a
zero-timeout epoll_wait. The epoll descriptor is a single low-numbered fd, so select's
FD_SETSIZE limit never applies to the connections themselves.
"""

from __future__ import annotations

import asyncio
import select
import selectors
import time


class PreciseEpollSelector(selectors.EpollSelector):
    """EpollSelector with microsecond timeouts (see the module docstring)."""

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout > 0:
            try:
                select.select([self._selector.fileno()], [], [], timeout)
            except InterruptedError:
                pass
            timeout = 0
        return super().select(timeout)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A selector event loop with precise timers where epoll exists (Linux), else the default."""
    if hasattr(selectors, "EpollSelector"):
        loop = asyncio.SelectorEventLoop(PreciseEpollSelector())
        # asyncio treats timers due within `_clock_resolution` as ready; time.monotonic's
        # resolution is 1 ns on Linux, so the precise wait above is what decides lateness.
        return loop
    return asyncio.new_event_loop()


class VirtualClock:
    """Emulated seconds = real seconds since start x speedup.

    Histograms record emulated seconds so that `/metrics` reads like the real engine's."""

    def __init__(self, speedup: float) -> None:
        if not speedup > 0:
            raise ValueError(f"speedup must be positive, got {speedup!r}")
        self.speedup = float(speedup)
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return (time.perf_counter() - self.t0) * self.speedup

    def real_delay(self, virtual_target: float) -> float:
        """Real seconds until the clock reads `virtual_target` (<= 0 when already past)."""
        return (virtual_target - self.now()) / self.speedup
