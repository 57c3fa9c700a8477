"""What the reference schedulers (:mod:`inferasim.sim.scheduler`) carry: a request and what its client
saw (:class:`Request`), the requests that hold KV on a rank as a struct of numpy arrays
(:class:`RunningSet`: a step touches all of them, and the vectorised form keeps the simulator
usable inside searches), and one step's work (:class:`Batch`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class Request:
    """One request and what the client saw of it.

    Token times are kept compactly (first token, last token, count) because the mean TPOT of a
    benchmark is (finish - first_token) / (output - 1); per-token gaps can be added when a
    percentile-of-gaps metric needs them."""

    rid: int
    arrival: float  # s, the client sent it
    prompt: int
    output: int
    prefix_hit: int = 0  # prompt tokens found in a prefix cache (none yet)
    rank: int = 0  # attention-dp rank that serves it
    first_token: float | None = None  # s, the client received the first token
    finish: float | None = None  # s, the client received the last token
    preemptions: int = 0
    generated: int = 0  # tokens sampled, as of its last preemption or its finish (kept by recompute)

    @property
    def ttft(self) -> float:
        assert self.first_token is not None
        return self.first_token - self.arrival

    @property
    def tpot(self) -> float:
        assert self.first_token is not None and self.finish is not None
        return (self.finish - self.first_token) / max(self.output - 1, 1)

    @property
    def e2e(self) -> float:
        assert self.finish is not None
        return self.finish - self.arrival


class RunningSet:
    """Requests holding KV on a rank, as parallel int64 arrays (rows compacted between steps).

    `comp` counts tokens whose KV is written; `gen` tokens sampled. A row is decoding when it has
    sampled a token and all but the last sampled token are in the KV (comp == prompt + gen - 1)."""

    FIELDS = ("rid", "prompt", "out", "gen", "comp", "seq")

    def __init__(self, capacity: int = 64) -> None:
        self.n = 0
        self._cap = capacity
        for name in self.FIELDS:
            setattr(self, name, np.zeros(capacity, dtype=np.int64))
        self.alive = np.ones(capacity, dtype=bool)
        self.dead = 0  # rows preempted this step, removed at the next compaction

    @property
    def n_alive(self) -> int:
        return self.n - self.dead

    def add(self, rid: int, prompt: int, out: int, gen: int, comp: int, seq: int) -> int:
        if self.n == self._cap:
            self._cap *= 2
            for name in self.FIELDS:
                arr = getattr(self, name)
                grown = np.zeros(self._cap, dtype=np.int64)
                grown[: self.n] = arr[: self.n]
                setattr(self, name, grown)
            alive = np.ones(self._cap, dtype=bool)
            alive[: self.n] = self.alive[: self.n]
            self.alive = alive
        row = self.n
        self.rid[row], self.prompt[row], self.out[row] = rid, prompt, out
        self.gen[row], self.comp[row], self.seq[row] = gen, comp, seq
        self.alive[row] = True
        self.n += 1
        return row

    def kill(self, row: int) -> None:
        self.alive[row] = False
        self.dead += 1

    def compact(self) -> None:
        """Drop dead rows, keeping the others in order."""
        if not self.dead:
            return
        keep = np.flatnonzero(self.alive[: self.n])
        m = keep.size
        for name in self.FIELDS:
            arr = getattr(self, name)
            arr[:m] = arr[keep]
        self.alive[: self.n] = True
        self.n, self.dead = m, 0


@dataclass
class Batch:
    """One engine step of one rank: the rows it touches and the step-time inputs."""

    dec_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    pre_rows: list[int] = field(default_factory=list)
    pre_chunks: list[int] = field(default_factory=list)
    pre_starts: list[int] = field(default_factory=list)
    ctx_dec: float = 0.0  # mean context a decode attends to (its KV plus the new token)

    @property
    def n_dec(self) -> int:
        return int(self.dec_rows.size)

    @property
    def n_pref(self) -> int:
        return int(sum(self.pre_chunks))

    @property
    def ctx_pref(self) -> float:
        """Token-weighted mean context a prefill token attends to: a chunk of L tokens from
        position s sees s + L/2 on average (the analytic model's isl/2 for a whole prompt)."""
        tot = self.n_pref
        if not tot:
            return 0.0
        return sum(n * (s + n / 2.0) for n, s in zip(self.pre_chunks, self.pre_starts, strict=True)) / tot

    @property
    def seq_pref(self) -> float | None:
        """The longest sequence among the prefills, cached prefix included (None without one):
        what decides a DSA model's dense-or-sparse prefill."""
        return float(max(n + s for n, s in zip(self.pre_chunks, self.pre_starts, strict=True))) \
            if self.pre_chunks else None

    @property
    def empty(self) -> bool:
        return not self.dec_rows.size and not self.pre_rows
