"""One request inside the emulator (:class:`EmuRequest`: its slot, rank, lengths, emulated times and
the sink its tokens go to) and the sink's signature.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from inferasim.sim.request import SimRequest

# A sink delivers a request's new tokens (and its finish) to the client. It returns False when
# it chose to hold intermediate tokens back (stream interval); the engine offers them again at
# its next wake.
Sink = Callable[["EmuRequest"], bool]


@dataclass(eq=False)
class EmuRequest:
    """One request inside the emulator. Times are emulated seconds."""

    rid: int  # slot: unique among live requests (the schedulers key on it), reused afterwards
    serial: int  # unique over the emulator's lifetime
    rank: int
    prompt: int
    output: int  # tokens it will generate (max_tokens with ignore_eos, else a drawn length)
    max_tokens: int
    finish_reason: str  # reason once `output` tokens are out: length | stop
    recv_v: float  # reached the API server
    enq_v: float  # reaches the engine core (recv + t_ttft, then the serial front end's t_front)
    sink: Sink  # called on delivery (tokens, finish)
    sim: SimRequest = field(repr=False, default=None)  # type: ignore[assignment]
    first_sched_v: float | None = None
    first_tok_v: float | None = None
    finish_v: float | None = None
    emitted: int = 0  # tokens produced by committed steps
    sent: int = 0  # tokens handed to the sink (the sink advances it)
    finished: bool = False
    aborted: bool = False
    error: str = ""

    @property
    def reason(self) -> str:
        return "abort" if self.aborted else self.finish_reason
