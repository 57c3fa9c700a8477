"""The simulator's streaming report: running sums and quantile sketches, fed while the replay runs,
so that a report's memory does not grow with the trace's length (DESIGN.md section 4).

Every client request is counted once, when it is over and its largest inter-token gap is known:
a rank's finished requests wait in `Core.finished` until the rank is flushed (every
`FLUSH_STEPS` engine steps, and at the end). A flush

- folds the decode-step ranges each request spent decoding (`Core.open_segs`, indices into the
  rank's step-end list `Core.E`) into its largest gap, by a range maximum over E's differences
  (see `inferasim.sim.report` for why the gaps are E's differences);
- counts the finished and dropped client requests (a disaggregated request when its decode phase
  ends, or its prefill phase when it asked for one token);
- moves E's differences, weighted by the requests that continued from one step to the next, and
  the gaps recorded one by one into the ITL sketch, and drops the part of E that no request still
  decoding can reach (E is kept from the earliest step a decoding row joined at).

What is kept across a whole run is one `QuantileSketch` per latency and a few sums.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from inferasim.sim.core import Core
from inferasim.sim.request import SimRequest
from inferasim.sim.sketch import QuantileSketch

# What the buffer keeps of a completed request (the columns `drain` reads), read in one C call.
_RECORD = attrgetter("arrival", "first_token", "finish", "output", "prompt", "max_gap")
FLUSH_STEPS = 1 << 14  # engine steps between flushes: E holds at most this many more step ends
QUANTILES = (50, 90, 99)


def range_max(d: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(d[lo_i:hi_i]) for every i (hi > lo), by a sparse table: O(n log n) once."""
    if d.size == 0 or lo.size == 0:
        return np.zeros(lo.size)
    n = d.size
    length = hi - lo
    top = int(length.max())
    # Level L (row L) holds the maxima of the 2^L-long windows; rows are padded to n, and no
    # lookup reaches the padding (a window of level L starts at most n - 2^L).
    tab = np.full((max(top, 1).bit_length(), n), -np.inf)
    tab[0] = d
    k = 1
    while 2 * k <= min(n, top):
        L = k.bit_length()
        tab[L, :n - 2 * k + 1] = np.maximum(tab[L - 1, :n - 2 * k + 1], tab[L - 1, k:n - k + 1])
        k *= 2
    lvl = np.floor(np.log2(np.maximum(length, 1))).astype(np.int64)
    # One gather over the table: a mask and two lookups per level cost several times more.
    return np.maximum(tab[lvl, lo], tab[lvl, hi - (np.int64(1) << lvl)])


class Tally:
    """Running figures of one simulation's client requests."""

    def __init__(self, slo_ttft_ms: float | None = None, slo_itl_ms: float | None = None) -> None:
        self.slo_ttft_ms = slo_ttft_ms
        self.slo_itl_ms = slo_itl_ms
        self.issued = 0
        self.completed = 0
        self.dropped = 0
        self.reasons: dict[str, int] = {}
        self.first_arrival = math.inf
        self.last_finish = -math.inf
        self.out_tokens = 0
        self.prompt_tokens = 0
        self.good = 0
        self.good_tokens = 0
        self._buf: list[tuple[float, float, float, int, int, float]] = []
        self.ttft = QuantileSketch()
        self.tpot = QuantileSketch()
        self.e2e = QuantileSketch()
        self.max_itl = QuantileSketch()
        self.itl = QuantileSketch()

    def add(self, r: SimRequest) -> None:
        """One client request, over (finished or dropped), its largest gap final."""
        self.add_all((r,))

    def add_all(self, reqs: Iterable[SimRequest]) -> None:
        """Client requests, over (finished or dropped), their largest gaps final. Completed ones
        wait in a buffer that `drain` empties in one numpy pass (a sketch add per request and
        latency cost more than the rest of a flush)."""
        buf = self._buf
        first = self.first_arrival
        issued = completed = 0
        for r in reqs:
            issued += 1
            if r.arrival < first:
                first = r.arrival
            if r.dropped is not None:
                self.dropped += 1
                key = str(r.dropped).split(":")[0]
                self.reasons[key] = self.reasons.get(key, 0) + 1
                continue
            if r.finish is None:
                continue
            completed += 1
            if r.first_token is not None:
                buf.append(_RECORD(r))
        self.issued += issued
        self.completed += completed
        self.first_arrival = first

    def drain(self) -> None:
        """Move the buffered requests into the sums and sketches."""
        buf = self._buf
        if not buf:
            return
        # The rows flattened through an iterator: np.array over a list of tuples reads each one
        # as a sequence, several times slower (the same float values).
        n = len(buf)
        a = np.fromiter(chain.from_iterable(buf), dtype=float, count=6 * n).reshape(n, 6)
        buf.clear()
        arrival, first, finish, out, prompt, max_gap = a.T
        ttft = first - arrival
        self.ttft.add_many(ttft)
        self.e2e.add_many(finish - arrival)
        self.last_finish = max(self.last_finish, float(finish.max()))
        self.out_tokens += int(out.sum())
        self.prompt_tokens += int(prompt.sum())
        multi = out > 1
        itl = np.where(multi, (finish - first) / np.maximum(out - 1.0, 1.0), 0.0)
        self.tpot.add_many(itl[multi])
        self.max_itl.add_many(max_gap[multi])
        # Goodput: TTFT and the request's mean inter-token latency within the SLO.
        ok = np.ones(ttft.size, dtype=bool)
        if self.slo_ttft_ms is not None:
            ok &= ttft * 1e3 <= self.slo_ttft_ms
        if self.slo_itl_ms is not None:
            ok &= itl * 1e3 <= self.slo_itl_ms
        self.good += int(ok.sum())
        self.good_tokens += int(out[ok].sum())

    def flush(self, cores: list[Core], dropped: list[SimRequest], final: bool = False) -> None:
        """Count what the ranks of one replica finished (and the requests it refused) since the
        last flush, and trim their step-end lists; `final`: the run is over."""
        for core in cores:
            self._flush_core(core, final)
        for r in dropped:
            self.add(r.parent or r)
        dropped.clear()
        self.drain()

    def _flush_core(self, core: Core, final: bool) -> None:
        E, cont, off = core.E, core.cont, core.e_off
        d = np.diff(np.asarray(E, dtype=float)) if len(E) > 1 else np.zeros(0)
        segs = core.open_segs
        if segs:
            owner, lo, hi = zip(*segs, strict=True)
            segs.clear()
            m = range_max(d, np.array(lo, dtype=np.int64) - off, np.array(hi, dtype=np.int64) - off)
            for r, v in zip(owner, m.tolist(), strict=True):
                if v > r.max_gap:
                    r.max_gap = v
        clients: list[SimRequest] = []
        for r in core.finished:
            parent = r.parent
            if parent is None:
                clients.append(r)
            elif r.prebuilt:  # the decode phase of a disaggregated request: the client's gaps
                if r.max_gap > parent.max_gap:
                    parent.max_gap = r.max_gap
                clients.append(parent)
            elif parent.output <= 1:  # its prefill phase was all it asked for
                clients.append(parent)
        core.finished.clear()
        self.add_all(clients)
        # E's differences up to the earliest step a row still decoding joined at stay (its range
        # maximum needs them); the last step end always stays (the next difference starts there).
        cut = off + len(E) - 1
        if not final:
            for row in core.drows:
                if row.i0 < cut:
                    cut = row.i0
        c = cut - off
        if c > 0:
            w = np.asarray(cont[1:c + 1], dtype=float)
            self.itl.add_many(d[:c], w)
            del E[:c]
            del cont[:c]
            core.e_off = cut
        if core.gaps:
            self.itl.add_many(np.asarray(core.gaps, dtype=float))
            core.gaps.clear()

    @property
    def duration(self) -> float:
        """s, first arrival to last token delivered (0 when nothing completed)."""
        if self.last_finish == -math.inf:
            return 0.0
        return float(self.last_finish - self.first_arrival)

    def goodput(self) -> dict[str, Any]:
        slo_ttft_ms, slo_itl_ms = self.slo_ttft_ms, self.slo_itl_ms
        dur = self.duration
        n = self.ttft.count
        slo_text = ", ".join(s for s in (f"TTFT <= {slo_ttft_ms:g} ms" if slo_ttft_ms is not None else "",
                                         f"ITL <= {slo_itl_ms:g} ms" if slo_itl_ms is not None else "") if s)
        return {
            "slo": slo_text or "none",
            "slo_ttft_ms": slo_ttft_ms,
            "slo_itl_ms": slo_itl_ms,
            "requests_per_s": self.good / dur if dur > 0 else 0.0,
            "tok_s": self.good_tokens / dur if dur > 0 else 0.0,
            "fraction": self.good / n if n else 0.0,
        }


def stats_ms(s: QuantileSketch) -> dict[str, float | None]:
    """Mean (exact) and percentiles (within the sketch's alpha) in ms."""
    if s.count <= 0:
        return {"mean": None, **{f"p{q}": None for q in QUANTILES}}
    ps = s.quantiles(tuple(q / 100.0 for q in QUANTILES))
    return {"mean": s.mean() * 1e3, **{f"p{q}": p * 1e3 for q, p in zip(QUANTILES, ps, strict=True)}}
