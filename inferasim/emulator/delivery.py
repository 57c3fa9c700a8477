"""Token delivery of the emulated engine: :class:`TokenDelivery`, the part of
:class:`inferasim.emulator.engine.EngineLoop` that counts each committed step's tokens per request
(first-token stamps, inter-token gaps, finishes, the histograms they feed) and hands them to the
requests' sinks.

Tokens are marked for delivery when their step is committed and delivered at its end. SGLang's late
first tokens (its overlap scheduler hands a prefill batch's first tokens out only after launching
the next batch) are held until the next step says when they leave, then delivered at that time,
on their own when it lies inside the step in progress.
"""

from __future__ import annotations

import heapq

import numpy as np

from inferasim.emulator.metrics import EngineMetrics
from inferasim.emulator.request import EmuRequest
from inferasim.sim.core import Core
from inferasim.sim.engines import SglangCore
from inferasim.sim.request import SimRequest


class TokenDelivery:
    """Token accounting and delivery; the engine loop (its subclass) owns the state below and
    steps the schedulers."""

    metrics: EngineMetrics
    v: float  # emulated time the engine is free (end of the last committed step)
    open: int  # live requests
    _slots: list[EmuRequest | None]
    _free: list[int]
    _gen_total: int

    def __init__(self, cap: int = 256) -> None:
        self._emitted = np.zeros(cap, dtype=np.int64)  # tokens counted per slot
        self._last = np.zeros(cap, dtype=np.float64)  # emulated time of each slot's last token
        self._dirty: set[int] = set()  # slots with something to deliver at the next flush
        # SGLang: first tokens the last prefill batch sampled, held until the next step says when
        # they leave (slot -> the scheduler's request), and first tokens whose time is known but
        # has not come yet (emulated time, serial, slot).
        self._held: dict[int, SimRequest] = {}
        self._releases: list[tuple[float, int, int]] = []
        # Late first tokens whose time has come: delivered on their own at a wake inside the step
        # in progress, whose own tokens (in _dirty) must wait for its end.
        self._due: set[int] = set()

    def abort(self, req: EmuRequest) -> None:
        """Stop a request whose sink failed (the engine loop's abort)."""
        raise NotImplementedError

    def _deliver_held_first(self, i: int, rank: Core, now_v: float) -> None:
        """Deliver a rank's held first tokens at their on-time stamp (the next step is a decode)."""
        if not isinstance(rank, SglangCore):
            return
        held = [sim for sim in rank.held_first_tokens if self._held.get(sim.rid) is sim]
        if not held:
            return
        release: dict[int, float] = {}
        for sim in held:
            del self._held[sim.rid]
            release[sim.rid] = (sim.first_token if sim.first_token is not None else self.v) - rank.delay
        self._emit_first_tokens(i, release, now_v)
        rank.release_on_time()

    def _emit_first_tokens(self, i: int, release: dict[int, float], now_v: float | None) -> None:
        """Count and stamp held first tokens outside a step's accounting (slot -> stamp), and
        schedule their delivery at the stamp."""
        rows = np.array(sorted(release), dtype=np.int64)
        self._emitted[rows] += 1
        stamps = np.array([release[int(rid)] for rid in rows])
        self._last[rows] = stamps
        ttfts = []
        prompts = 0
        for rid, t in zip(rows.tolist(), stamps.tolist(), strict=True):
            req = self._slots[rid]
            if req is not None:
                req.first_tok_v = t
                ttfts.append(t - req.recv_v)
                prompts += req.prompt
            self._schedule_delivery(rid, t, now_v)
        self.metrics.on_first_tokens(i, np.asarray(ttfts), prompts)
        self.metrics.on_tokens(i, int(rows.size), None)  # no step of its own: no iteration tokens
        self._gen_total += int(rows.size)

    def _schedule_delivery(self, rid: int, t: float, now_v: float | None) -> None:
        if now_v is None or t <= now_v:
            self._due.add(rid)
        else:
            req = self._slots[rid]
            heapq.heappush(self._releases, (t, req.serial if req is not None else 0, rid))

    def _release_due(self, now_v: float) -> bool:
        """Mark the late first tokens whose time has come for delivery; True if any wait."""
        heap = self._releases
        while heap and heap[0][0] <= now_v:
            _, serial, rid = heapq.heappop(heap)
            req = self._slots[rid]
            if req is not None and req.serial == serial:
                self._due.add(rid)
        return bool(self._due)

    def _flush_due(self) -> None:
        """Deliver the late first tokens whose time has come, and nothing else: whatever else is
        marked for delivery may belong to the step in progress. The client sees each request as it
        stood at its first token (one token, not finished); tokens committed after it, and its
        finish, go with the next full flush, at their own step's end."""
        if not self._due:
            return
        due, self._due = self._due, set()
        for rid in due:
            req = self._slots[rid]
            if req is None:
                continue
            if int(self._emitted[rid]) > 1 or req.finished:
                self._dirty.add(rid)  # the rest, later
            finished, req.finished = req.finished, False
            req.emitted = max(req.emitted, 1)
            failed = False
            try:
                delivered = req.sink(req)
            except Exception as exc:  # a broken client must not stop the engine
                req.error = f"delivery failed: {exc}"
                delivered = failed = True
            finally:
                req.finished = finished
            if failed and not req.finished:
                self.abort(req)  # as _flush does: the request goes, its error with it
            elif not delivered:
                self._dirty.add(rid)

    def _account(self, i: int, rank: Core, finished: list[SimRequest], end: float, release: dict[int, float],
                 now_v: float | None) -> None:
        """Token accounting of one committed step: new tokens per request (held first tokens
        excluded), first-token stamps (a released one at its own time), gaps, finishes."""
        reqs, counts = rank.running()
        rids = np.array([req.rid for req in reqs], dtype=np.int64)
        gens = np.array(counts, dtype=np.int64)
        if finished:
            rids = np.concatenate([rids, np.array([f.rid for f in finished], dtype=np.int64)])
            gens = np.concatenate([gens, np.array([f.generated for f in finished], dtype=np.int64)])
        new = gens - self._emitted[rids]
        got = new > 0
        if self._held:
            got &= ~np.isin(rids, np.fromiter(self._held, dtype=np.int64, count=len(self._held)))
        rows = rids[got]
        n_new = new[got]
        total = int(n_new.sum())
        prompt_first = 0
        later_gaps: list[float] = []
        if rows.size:
            before = self._emitted[rows]
            first = before == 0
            if first.any():
                ttfts = []
                for rid, k in zip(rows[first].tolist(), n_new[first].tolist(), strict=True):
                    req = self._slots[rid]
                    t_first = release.get(rid, end)
                    if k > 1:  # a late first token and the next one in this step
                        later_gaps.append(end - t_first)
                    if req is not None:
                        req.first_tok_v = t_first
                        ttfts.append(t_first - req.recv_v)
                        prompt_first += req.prompt
                self.metrics.on_first_tokens(i, np.asarray(ttfts), prompt_first)
            cont = rows[~first]
            gaps = end - self._last[cont] if cont.size else None
            if later_gaps:
                gaps = np.concatenate([gaps, later_gaps]) if gaps is not None else np.asarray(later_gaps)
            self._emitted[rows] = before + n_new
            self._last[rows] = end
            for rid in rows.tolist():
                if rid in release:
                    self._schedule_delivery(rid, release[rid], now_v)
                else:
                    self._dirty.add(rid)
        else:
            gaps = None
        self.metrics.on_tokens(i, total, gaps, None, np.array([float(total + prompt_first)]))
        self._gen_total += total
        for sim in finished:
            self._finish(sim.rid, end)

    def _finish(self, rid: int, end: float) -> None:
        req = self._slots[rid]
        if req is None or req.finished:
            return
        req.finished = True
        req.finish_v = end
        self._dirty.add(rid)
        self._record_finish(req)

    def _record_finish(self, req: EmuRequest) -> None:
        end = req.finish_v if req.finish_v is not None else self.v
        fs, ft = req.first_sched_v, req.first_tok_v
        self.metrics.on_finished(
            req.rank, req.reason, req.prompt, int(self._emitted[req.rid]), req.max_tokens, end - req.recv_v,
            queue=(fs - req.enq_v) if fs is not None else None,
            prefill=(ft - fs) if ft is not None and fs is not None else None,
            decode=(end - ft) if ft is not None else None,
            inference=(end - fs) if fs is not None else None)

    def _flush(self) -> None:
        """Deliver everything marked (called when every committed step has ended)."""
        if self._due:
            self._dirty |= self._due
            self._due = set()
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        slots = self._slots
        for rid in dirty:
            req = slots[rid]
            if req is None:
                continue
            req.emitted = int(self._emitted[rid])
            try:
                delivered = req.sink(req)
            except Exception as exc:  # a broken client must not stop the engine
                req.error = f"delivery failed: {exc}"
                delivered = True
                if not req.finished:
                    self.abort(req)
            if not delivered:
                self._dirty.add(rid)
            elif req.finished:
                slots[rid] = None
                self._free.append(rid)
                self.open -= 1
