"""Stage 2 of the search: the trace simulator replays the best candidates of stage 1, in rounds,
spending replays only where they can change the answer.

Honesty rule: every candidate that ends up recommended or short-listed was replayed in full. A
candidate is left at its stage-1 estimate only when it can no longer reach the short list
whatever its replay says: candidates are replayed in stage-1 order in rounds of `ROUND`, and
when a round is drawn a candidate is skipped when at least `shortlist_n` already-final candidates of distinct
shapes outscore the best score its replay could give it (`upper`: the SLO met, and the SLO
capacity at the largest value stage 2 ever sets, see tune._trust_the_replay, _recalibrate_capacity
and _add_replicas). The short list takes the best candidate of each shape in rank order, so that
many distinct shapes above it fill the list before it. Only candidates within the SLO are final
(stage 2 retries misses with more replicas afterwards). Rounds are fixed in size, so the same
candidates are replayed whatever the number of worker processes.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Hashable
from typing import Any

from inferasim.search.estimate import Estimate
from inferasim.search.select import shortlist
from inferasim.search.workload import WorkloadShape

ROUND = 2  # candidates replayed between two pruning decisions
Progress = Callable[[str, int, int], None]
Score = tuple[Any, ...]


def simulate_one(e: Estimate, w: WorkloadShape) -> dict[str, Any] | None:
    """The discrete-event simulator on one candidate: the workload itself (sessions, prefix
    reuse, arrivals) replayed request by request on the candidate's replicas; None when the
    simulator does not apply (disaggregated candidates, no finite step time, no replayable
    workload). Returns the report's summary (no series)."""
    from inferasim.sim.api import simulate_workload
    from inferasim.sim.collector import paused_collector

    c = e.candidate
    split = c.disagg
    # The simulator's prefill and decode pools share one layout: a disaggregated candidate whose
    # pools differ keeps its stage-1 estimate.
    if (split is not None and split.prefill != split.decode) or not math.isfinite(e.tpot) or w.source is None:
        return None
    src = w.source
    if src.kind == "closed":
        # A closed loop over all replicas: the spec's clients.
        src = src.model_copy(update={"num_requests": min(src.num_requests, max(4 * (src.concurrency or 1), 200))})
    # The collector stays paused until the report (and with it the simulation's requests) is
    # dropped: the state dies by reference counting and is never scanned.
    # Stage 1 prices every replica with the workload's whole prefix reuse; a multi-turn session
    # keeps it only where its turns return to the replica holding its KV. Replayed with that
    # (session-affine, prefix-aware) routing, as stage 1 assumes: round-robin split the sessions
    # (hit 0.76 -> 0.51 at 2 replicas) and the gap read as a slower replay. The table notes it.
    router = "prefix" if src.kind == "multi-turn" and (e.replicas > 1 or split is not None) else "rr"
    # A disaggregated candidate: its replicas x (prefill workers, decode workers) pools.
    pools = None if split is None else (split.prefill_workers * e.replicas, split.decode_workers * e.replicas)
    with paused_collector():
        report = simulate_workload(e.fitted, c.layout if split is None else split.decode, src,
                                   replicas=e.replicas if split is None else 1, max_num_seqs=c.max_num_seqs,
                                   max_batched_tokens=c.max_batched_tokens,
                                   mixed=None if c.chunked_prefill else False, seed=1, router=router, disagg=pools,
                                   records=False)
        d = report.as_dict(series=False)
        del report
    return d


def apply_replay(e: Estimate, d: dict[str, Any] | None) -> Estimate:
    """Stage 2's refinement of `e` from its simulation summary `d` (see `_simulate_one`):
    percentiles measured instead of assumed."""
    if d is None:
        return e
    if not d["completed"]:
        e.notes.append("the simulation completed no request")
        return e
    e.ttft, e.tpot = d["ttft"]["mean"] / 1e3, d["itl"]["mean"] / 1e3
    e.ttft_p90, e.itl_p90 = d["ttft"]["p90"] / 1e3, d["itl"]["p90"] / 1e3
    if d["dropped"]:
        e.notes.append(f"{d['dropped']} of {d['requests']} requests dropped in simulation: {d['dropped_reasons']}")
    e.stage = 2
    return e


class Replays:
    """The replays made so far, each shared with every candidate it provably stands for: the same
    deployment, replica count and workload, differing only in `max_num_seqs` when the replay's
    peak stayed below both limits and the KV pool does not depend on it
    (sim.api.same_replay_under): the simulator would make the same steps for them, so their
    "replay in full" is that one. `simulations` counts the simulator runs."""

    def __init__(self, w: WorkloadShape) -> None:
        self.w = w
        self.simulations = 0
        self._done: dict[Hashable, list[tuple[int, dict[str, Any]]]] = {}

    @staticmethod
    def key(e: Estimate) -> Hashable:
        # The fitted anchor is one object per (engine, precision) in a search.
        return id(e.fitted), dataclasses.replace(e.candidate, max_num_seqs=0), e.replicas

    def find(self, e: Estimate) -> dict[str, Any] | None:
        """A replay that stands for `e`'s, or None."""
        from inferasim.sim.api import differ_in_max_num_seqs_only, same_replay_under

        c = e.candidate
        layout = c.layout if c.disagg is None else c.disagg.decode
        for seqs, d in self._done.get(self.key(e), ()):
            if seqs == c.max_num_seqs or (same_replay_under(d["limits"], c.max_num_seqs) and
                                          differ_in_max_num_seqs_only(e.fitted, layout, seqs, c.max_num_seqs,
                                                                      c.max_batched_tokens)):
                return d
        return None

    def add(self, e: Estimate, d: dict[str, Any] | None) -> None:
        if d is not None:
            self.simulations += 1
            self._done.setdefault(self.key(e), []).append((e.candidate.max_num_seqs, d))

    def get(self, e: Estimate) -> dict[str, Any] | None:
        """`e`'s replay summary: a shared one, else a new simulation."""
        d = self.find(e)
        if d is None:
            d = _summary_fields(simulate_one(e, self.w))
            self.add(e, d)
        return d


# What the stage-2 worker processes simulate: set before they are forked, so that each task
# carries an index only (no Estimate, FittedAnchor or workload pickled per task).
_JOBS: tuple[list[Estimate], WorkloadShape] | None = None


def _summary_fields(d: dict[str, Any] | None) -> dict[str, Any] | None:
    """The part of a report summary that `apply_replay` and `Replays` read: what comes back from
    a worker."""
    if d is None:
        return None
    return {"completed": d["completed"], "ttft": {k: d["ttft"][k] for k in ("mean", "p90")},
            "itl": {k: d["itl"][k] for k in ("mean", "p90")}, "dropped": d["dropped"], "requests": d["requests"],
            "dropped_reasons": d["dropped_reasons"], "limits": dict(d["limits"])}


def _worker_job(i: int) -> tuple[int, dict[str, Any] | None]:
    assert _JOBS is not None
    top, w = _JOBS
    return i, _summary_fields(simulate_one(top[i], w))


def can_skip(bound: Score, finals: list[tuple[Score, Hashable]], shortlist_n: int) -> bool:
    """True when `shortlist_n` distinct shapes among the final (score, shape) pairs score above
    `bound`: a candidate whose replay cannot score above `bound` stays off the short list."""
    shapes = {shape for score, shape in finals if score > bound}
    return len(shapes) >= shortlist_n


def run_stage2(top: list[Estimate], w: WorkloadShape, workers: int, progress: Progress | None = None, *,
               finish: Callable[[Estimate, Estimate], None] | None = None,
               final: Callable[[Estimate], tuple[Score, Hashable] | None] | None = None,
               upper: Callable[[Estimate], Score] | None = None, shortlist_n: int = 5, shapes: int = 0,
               replays: Replays | None = None) -> list[Estimate]:
    """Replay `top` (stage-1 order) and return their refined copies, or the originals for the
    candidates left out. `finish(before, after)` completes a replayed copy (SLO verdict, capacity);
    `final(e)` is (score, shape) when e's score is final, else None; `upper(e)` bounds the score
    of e's replay. Without `final` and `upper` every candidate is replayed. `shapes`: the distinct
    shapes of the whole ranking (the short list is then the best candidate of each of its first
    `shortlist_n` shapes, with no fill). `replays` collects the simulations (for the retries
    that follow).

    A candidate is also left out when a final candidate of its own shape already scores at least
    its bound (and precedes it, so that a tie keeps the replayed one first): it cannot be the best
    of its shape, so neither the recommendation nor on the short list. Candidates that differ
    only in batching limits are one shape: a shape's first candidate is replayed alone, and its
    siblings wait for that replay (most of them are then decided). Where a replay provably stands
    for a sibling's (`Replays`), the sibling takes it."""
    global _JOBS
    replays = replays if replays is not None else Replays(w)
    out: list[Estimate] = list(top)
    finals: list[tuple[Score, Hashable]] = []
    best_of: dict[Hashable, tuple[Score, int]] = {}  # shape -> its best final (score, position)
    todo = list(range(len(top)))
    shape_of = [e.candidate.shape for e in top]
    flying: set[Hashable] = set()  # shapes with a replay in flight
    prune = final is not None and upper is not None
    done = 0
    if progress:
        progress("stage 2", 0, len(top))
    pool = None
    if workers > 1 and len(top) > 4:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        import inferasim.sim.api  # noqa: F401 - once, before the fork, not once in every worker

        _JOBS = (top, w)
        # Forked once for every round: the workers inherit the loaded catalogs, caches and _JOBS.
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork"))

    def decided(i: int) -> bool:
        assert upper is not None
        bound = upper(top[i])
        if len(finals) >= shortlist_n and can_skip(bound, finals, shortlist_n):
            return True
        mine = best_of.get(shape_of[i])
        return shapes >= shortlist_n and mine is not None and (mine[0] > bound or (mine[0] == bound and mine[1] < i))

    def next_round(size: int) -> list[int]:
        nonlocal todo
        if prune:
            todo = [i for i in todo if not decided(i)]
        batch: list[int] = []
        for i in todo:
            if len(batch) == size:
                break
            if prune and shape_of[i] in flying:
                continue  # a replay of its shape is in flight: it may decide this one
            flying.add(shape_of[i])
            batch.append(i)
        todo = [i for i in todo if i not in batch]
        return batch

    def start(batch: list[int]) -> list[Any]:
        # One task per candidate, handed out as workers free up, the costliest first (a replay's
        # time grows with its replicas' GPUs: the longest ones last would leave a worker idle);
        # results are read in the round's order whatever the order they finish in.
        if pool is None:
            return list(batch)
        futures = {i: pool.submit(_worker_job, i) for i in sorted(batch, key=lambda i: -top[i].gpus)}
        return [futures[i] for i in batch]

    def results(jobs: list[Any]) -> list[tuple[int, dict[str, Any] | None]]:
        if pool is not None:
            return [f.result() for f in jobs]
        return [(i, _summary_fields(simulate_one(top[i], w))) for i in jobs]

    def settle(i: int, d: dict[str, Any] | None) -> None:
        nonlocal done
        e = apply_replay(copy_estimate(top[i]), d)
        if finish is not None:
            finish(top[i], e)
        out[i] = e
        got = final(e) if final is not None else None
        if got is not None:
            finals.append(got)
            score, shape = got
            if shape not in best_of or score > best_of[shape][0]:
                best_of[shape] = (score, i)
        done += 1
        if progress:
            progress("stage 2", done, len(top))

    try:
        # The first round holds the first `shortlist_n` shapes (the short list, if the replays
        # confirm stage 1); then two rounds in flight: round k + 2 is decided once round k is in,
        # so the workers never wait at a round's end. The decisions (on the rounds already in
        # only) are the same whatever the number of workers, in process or not.
        flight = [start(next_round(shortlist_n if prune else ROUND))]
        while flight:
            jobs = flight.pop(0)
            for i, d in results(jobs):
                flying.discard(shape_of[i])
                replays.add(top[i], d)
                settle(i, d)
                shared = [j for j in todo if d is not None and replays.find(top[j]) is d]
                for j in shared:
                    settle(j, d)
                todo = [j for j in todo if j not in shared]
            while len(flight) < 2:
                batch = next_round(ROUND)
                if not batch:
                    break
                flight.append(start(batch))
        if progress and done < len(top):
            progress("stage 2", len(top), len(top))  # the rest were decided without a replay of their own
    finally:
        if pool is not None:
            pool.shutdown()
            _JOBS = None
    return out


def copy_estimate(e: Estimate) -> Estimate:
    """Stage 2 refines a copy: the stage-1 objects stay as they were, so that the Pareto front is
    drawn from one model over the whole space, whether stage 2 ran in this process or in workers."""
    out = copy.copy(e)
    out.notes = list(e.notes)
    return out


def with_shapes(top: list[Estimate], rest: list[Estimate], n: int) -> tuple[list[Estimate], list[Estimate]]:
    """`top` and the first candidate of each further shape of `rest` until `top` holds `n` shapes;
    and what is left of `rest`, in its order."""
    shapes = {e.candidate.shape for e in top}
    extra = []
    for e in rest:
        if len(shapes) >= n:
            break
        if e.candidate.shape not in shapes:
            shapes.add(e.candidate.shape)
            extra.append(e)
    taken = set(map(id, extra))
    return top + extra, [e for e in rest if id(e) not in taken]


def replay_the_shortlist(replayed: list[Estimate], rest: list[Estimate], score: Callable[[Estimate], Any],
                          finish: Callable[[Estimate, Estimate], None], retry: Callable[[Estimate], Estimate],
                          replays: Replays, limit: int = 50) -> list[Estimate]:
    """The ranking: stage 2's candidates by score, then the rest in stage-1 order; a candidate of
    the rest that reaches the short list (stage 2's top held fewer than five shapes) is replayed
    (`finish`, then `retry` with more replicas if it missed), and placed again, until every
    short-listed candidate was replayed (`limit` replays at most): the honesty rule holds past
    stage 2's top too."""
    rest = list(rest)
    tried: set[int] = set()
    while True:
        ranked = sorted(replayed, key=score, reverse=True) + rest
        todo = [e for e in shortlist(ranked, 5) if e.stage == 1 and id(e) not in tried and
                any(e is r for r in rest)]
        if not todo or len(tried) >= limit:
            return ranked
        for e in todo:
            tried.add(id(e))
            rest = [r for r in rest if r is not e]
            after = apply_replay(copy_estimate(e), replays.get(e))
            finish(e, after)
            replayed.append(retry(after))
