"""The engine's serial front end in the discrete-event simulators (`sim.des`, `sim.replica`).

One FIFO server per replica in front of the ranks' queues (SGLang's TokenizerManager and
scheduler admission, vLLM's API server process): a request sent at t starts at max(t, the previous
request's departure) and departs `t_front + t_front_token x prompt` later (the scalar form of
`StepParams.front_time`), reaching its rank's pending queue then. Requests wait in `queue`,
ordered by send time, until the owner's clock reaches their start. With t_front = t_front_token =
0 the server is off (`on` False) and nothing goes through it.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from typing import Generic, Protocol, TypeVar

from inferasim.model.steptime import StepParams


class _Routed(Protocol):
    rank: int
    prompt: int


R = TypeVar("R", bound=_Routed)


class FrontEnd(Generic[R]):
    __slots__ = ("t_front", "per_token", "on", "queue", "free")

    def __init__(self, p: StepParams) -> None:
        self.t_front = float(p.t_front)
        self.per_token = float(p.t_front_token)  # per prompt token, on top of t_front
        self.on = self.t_front > 0.0 or self.per_token > 0.0
        # Sent, not yet taken up, in order of (send time, seq). Requests come in that order but
        # for a few a router hands over late (inserted in place): a sorted deque, where a heap of
        # a whole trace's requests cost a sift through its depth for every one taken up.
        self.queue: deque[tuple[float, int, R]] = deque()
        self.free = 0.0  # when the server has passed its last request

    def push(self, t: float, seq: int, req: R) -> None:
        queue = self.queue
        item = (t, seq, req)
        if not queue or queue[-1] < item:  # (t, seq) pairs are unique: `req` is never compared
            queue.append(item)
        else:
            bisect.insort(queue, item)

    def pass_until(self, now: float, pending: list[list[tuple[float, int, R]]]) -> None:
        """Take up, in order of sending, every request the server starts by `now`; each goes to
        `pending[req.rank]` keyed by its departure."""
        queue, tf, per_token, free = self.queue, self.t_front, self.per_token, self.free
        while queue:
            t, seq, req = queue[0]
            if t < free:
                t = free
            if t > now:
                break
            queue.popleft()
            free = t + tf + per_token * req.prompt
            heapq.heappush(pending[req.rank], (free, seq, req))
        self.free = free

    def next_departure(self) -> float:
        """When the server next passes a request on, if none sent earlier comes first (inf when
        it holds none): a lower bound for every rank."""
        queue = self.queue
        if not queue:
            return math.inf
        t, _, req = queue[0]
        return (t if t > self.free else self.free) + self.t_front + self.per_token * req.prompt

    def sent_by(self, now: float) -> int:
        """Requests in the queue sent by `now`, counted without taking any up."""
        n = 0
        for t, _, _ in self.queue:
            if t > now:
                break
            n += 1
        return n
