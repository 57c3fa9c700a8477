"""Replicas behind a router, and disaggregated prefill/decode pools (DESIGN.md section 4).

Routers (`--router`):
- `rr`: round robin.
- `least`: the replica with the fewest outstanding tokens (prompt + output of the requests routed
  to it and not finished; ties to the lowest index).
- `prefix`: the replica whose prefix cache holds the longest prefix of the request (ties and
  misses to `least`), unless the pool is imbalanced — outstanding requests spread by more than 32
  and the busiest above 1.5 x the idlest — then `least` (after SGLang's cache-aware router and
  its balance thresholds).

Disaggregation: a request is first prefilled in the prefill pool (the prompt, one sampled token),
then its KV moves to a decode worker: the decode worker allocates the prompt's KV when it admits
the request (as vLLM's NIXL connector and SGLang's decode pre-allocation do), the transfer takes
`inferasim.model.transfer.kv_transfer_time` (scale-up link when both pools fit one NVLink/xGMI domain,
else the scale-out NIC), and the first token reaches the client when the transfer is done; the
decode worker then produces the rest. The prefill worker frees the KV at once (it is not held
until the transfer ends). Client-side latency (`StepParams.t_ttft`) is added by the decode pool.

Time: each replica has its own clock. Before a request is routed at time t, every busy replica
steps until its next step would start at or after t, so the router sees every replica as of t (a
step in flight at t counts as done, at most one step early). When finishes cause new requests
(closed loops, sessions, the decode phase of a disaggregated request), the busy replicas advance
in a conservative lockstep: the one with the earliest clock goes, up to the earliest time another
could finish a request (`Replica.event_lb`), and stops when it finishes one itself; so a request
caused at time e reaches a replica at most one step after e. Open-loop traffic under round robin needs
neither: its replicas run one after the other.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable

from inferasim.sim.replica import Replica
from inferasim.sim.request import SimRequest
from inferasim.sim.workload import Driver

ROUTERS = ("rr", "least", "prefix")
BALANCE_ABS = 32
BALANCE_REL = 1.5


class Router:
    def __init__(self, kind: str) -> None:
        if kind not in ROUTERS:
            raise ValueError(f"router {kind!r} is not one of {', '.join(ROUTERS)}")
        self.kind = kind
        self._rr = 0

    def pick(self, req: SimRequest, pool: list[Replica]) -> Replica:
        if len(pool) == 1:
            return pool[0]
        if self.kind == "rr":
            rep = pool[self._rr % len(pool)]
            self._rr += 1
            return rep
        least = min(pool, key=lambda r: (r.load(), r.index))
        if self.kind == "least" or req.ids is None or req.prebuilt:
            return least
        counts = [r.outstanding for r in pool]
        hi, lo = max(counts), min(counts)
        if hi - lo > BALANCE_ABS and hi > BALANCE_REL * lo:
            return least
        best, best_tok = least, 0
        for r in pool:
            tok = r.prefix_match(req)
            if tok > best_tok or (tok == best_tok and tok > 0 and r.load() < best.load()):
                best, best_tok = r, tok
        return best


class Cluster:
    """A colocated pool of replicas, or a prefill pool and a decode pool."""

    def __init__(self, pool: list[Replica], router: str = "rr", decode_pool: list[Replica] | None = None,
                 transfer: Callable[[int], float] | None = None, client_delay: float = 0.0) -> None:
        self.pool = pool
        self.decode_pool = decode_pool or []
        self.router = Router(router)
        self.decode_router = Router("least" if router == "prefix" else router)
        self.transfer = transfer or (lambda tokens: 0.0)
        self.client_delay = client_delay
        self._heap: list[tuple[float, int, int, SimRequest]] = []
        self._seq = 0
        self.driver: Driver | None = None
        self._direct_queue: deque[tuple[SimRequest, float]] = deque()
        self._direct_busy = False

    @property
    def replicas(self) -> list[Replica]:
        return self.pool + self.decode_pool

    @property
    def disaggregated(self) -> bool:
        return bool(self.decode_pool)

    # -- arrivals --------------------------------------------------------------------------------
    def _push(self, req: SimRequest, t: float, stage: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, stage, req))

    def _client_submit(self, req: SimRequest, t: float) -> None:
        self._push(req, t, 0)

    def _route(self, req: SimRequest, t: float, stage: int) -> None:
        if stage == 0 and self.disaggregated:
            child = SimRequest(req.rid, t, req.prompt, 1, req.ids, req.unit, req.id_tokens, req.session)
            child.parent = req
            if not self.router.pick(child, self.pool).submit(child, t):
                self._drop(req, child.dropped)
            return
        pool = self.decode_pool if stage == 1 else self.pool
        rep = (self.decode_router if stage == 1 else self.router).pick(req, pool)
        if not rep.submit(req, t):
            self._drop(req.parent or req, req.dropped)

    def _drop(self, client: SimRequest, why: str | None) -> None:
        client.dropped = why or "dropped"
        if self.driver is not None:
            self.driver.on_finish(client, self._client_submit)

    def _on_finish(self, req: SimRequest) -> None:
        parent = req.parent
        if parent is None:
            assert self.driver is not None
            self.driver.on_finish(req, self._client_submit)
            return
        if req.prebuilt:  # decode phase done: the client request is complete
            parent.first_token = req.first_token
            parent.finish = req.finish
            parent.generated = req.generated
            parent.preemptions += req.preemptions
            parent.max_gap = req.max_gap
            parent.replica = req.replica
            assert self.driver is not None
            self.driver.on_finish(parent, self._client_submit)
            return
        # Prefill phase done: hand the KV to the decode pool.
        parent.prefix_hit = req.prefix_hit
        parent.host_hit = req.host_hit
        parent.preemptions += req.preemptions
        t_done = req.finish if req.finish is not None else req.arrival  # prefill pool: no client delay
        if parent.output <= 1:
            parent.first_token = parent.finish = t_done + self.client_delay
            parent.generated = 1
            assert self.driver is not None
            self.driver.on_finish(parent, self._client_submit)
            return
        child = SimRequest(parent.rid, t_done, parent.prompt, parent.output, session=parent.session)
        child.prebuilt = True
        child.load_s = self.transfer(parent.prompt)
        child.parent = parent
        self._push(child, t_done, 1)

    # Bound methods rather than closures: a closure that passes itself on would be a reference
    # cycle holding the whole simulation until the cyclic collector runs.
    def _submit_direct(self, req: SimRequest, t: float) -> None:
        # A refused request finishes at once, and a closed loop answers with its next request: a
        # loop, not a recursion (thousands of refusals in a row once overflowed the stack).
        self._direct_queue.append((req, t))
        if self._direct_busy:
            return
        self._direct_busy = True
        try:
            while self._direct_queue:
                nxt, at = self._direct_queue.popleft()
                rep = self.router.pick(nxt, self.pool)
                if not rep.submit(nxt, at):
                    assert self.driver is not None
                    self.driver.on_finish(nxt, self._submit_direct)
        finally:
            self._direct_busy = False

    def _finish_direct(self, req: SimRequest) -> None:
        assert self.driver is not None
        self.driver.on_finish(req, self._submit_direct)

    def _finish_open(self, req: SimRequest) -> None:
        """`_finish_direct` for a driver whose finishes cause nothing (open loop)."""

    # -- the loop --------------------------------------------------------------------------------
    def run(self, driver: Driver) -> None:
        self.driver = driver
        reps = self.replicas
        if len(reps) == 1 or (not driver.closed and not self.disaggregated and self.router.kind == "rr"):
            # Routing does not depend on the replicas' state: hand every request over as it comes
            # and run each replica on its own.
            finish = self._finish_open if type(driver).on_finish is Driver.on_finish else self._finish_direct
            batches = driver.stream()
            if batches is None:
                driver.start(self._submit_direct)
            else:
                # A streamed workload: each replica runs up to a batch's first arrival before the
                # batch is read (as the routed path below runs them up to each arrival).
                for batch in batches:
                    t = batch[0].arrival
                    for rep in reps:
                        rep.run_until(t, finish)
                    for req in batch:
                        self._submit_direct(req, req.arrival)
            for rep in reps:
                rep.run_until(math.inf, finish)
            return
        driver.start(self._client_submit)
        heap = self._heap
        on_finish = self._on_finish
        lockstep = driver.closed or self.disaggregated
        # A replica's next activity and event bound change only when it runs or is routed a
        # request: kept per replica (by position) until then, not recomputed for every replica at
        # every turn of the lockstep (which ran one replica per turn and asked all of them).
        n = len(reps)
        act: list[float | None] = [None] * n
        lbs: list[float | None] = [None] * n
        order = list(range(n))
        while True:
            t = heap[0][0] if heap else math.inf
            if not lockstep:
                for rep in reps:
                    if rep.outstanding:
                        rep.run_until(t, on_finish)
            else:
                # The replica that acts first (ties to the lowest index, then the first listed):
                # a loop, not min() over tuples with a key, on the hottest path of a lockstep run.
                k = -1
                a = math.inf
                for i in order:
                    rep = reps[i]
                    if not rep.outstanding:
                        continue
                    x = act[i]
                    if x is None:
                        x = act[i] = rep.next_activity()
                    if k < 0 or x < a or (x == a and rep.index < reps[k].index):
                        a, k = x, i
                if k >= 0 and a < t:
                    first = reps[k]
                    # Run it up to the earliest time another replica could cause a request,
                    # and stop when it causes one itself.
                    horizon = t
                    for i in order:
                        if i != k and reps[i].outstanding:
                            lb = lbs[i]
                            if lb is None:
                                lb = lbs[i] = reps[i].event_lb()
                            if lb < horizon:
                                horizon = lb
                    if a > first.now:
                        first.now = a  # idle until then, and no one acts earlier
                    before = (first.now, first.steps, first.outstanding)
                    first.run_until(horizon, on_finish, at_least_one=True, stop_on_finish=True)
                    if (first.now, first.steps, first.outstanding) == before:
                        first.blocked()
                    act[k] = lbs[k] = None
                    continue
            busy = [rep for rep in reps if rep.outstanding]
            if not heap:
                if any(rep.outstanding for rep in reps):
                    if lockstep and not busy:
                        raise RuntimeError("replicas stuck with requests outstanding")
                    if lockstep and all(rep.next_activity() == math.inf for rep in busy):
                        raise RuntimeError("replicas stuck with requests outstanding")
                    continue
                break
            if heap[0][0] < t:
                continue  # a finish caused an earlier arrival: route it first
            t, _, stage, req = heapq.heappop(heap)
            self._route(req, t, stage)
            act = [None] * n  # the request went to one of them
            lbs = [None] * n
