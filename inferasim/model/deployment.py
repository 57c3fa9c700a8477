"""One deployment's prediction with its 90% intervals: `predict_deployment`.

The question every front end asks (`inferasim predict`, the demo, the operator's checks): a fitted
kernel set at one layout and replica count, under a closed loop of clients or Poisson arrivals at a
rate, at one prompt and output length. The answer carries what the benchmark model says of the
load too: requests a replica runs at once and what holds the rest back, or the rate beyond which
the queue grows without bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from inferasim.core.layout import Layout
from inferasim.errors import UserError
from inferasim.model.layoutcost import layout_cost
from inferasim.model.predictor import FittedAnchor
from inferasim.model.steady import closed_loop, engine_sched, open_loop


class RequestTooLong(UserError):
    """Not one request of this length fits the KV pool of an engine core: nothing to price."""


@dataclass(frozen=True)
class DeploymentPrediction:
    """Means over requests; `*_interval` are 90% bands (None where the metric has no value)."""

    layout: Layout
    replicas: int
    isl: int
    osl: int
    concurrency: int | None
    request_rate: float | None
    ttft_ms: float | None  # None: the queue grows without bound (open loop beyond capacity)
    tpot_ms: float | None  # None: one output token has no inter-token interval
    throughput: float  # output tokens/s of all replicas
    stable: bool
    extrapolated: bool
    per_replica: int  # clients (or requests in flight) one replica serves
    ttft_interval: tuple[float, float] | None = None
    tpot_interval: tuple[float, float] | None = None
    throughput_interval: tuple[float, float] | None = None  # output tokens/s of all replicas
    running_per_replica: int | None = None  # set where fewer run at once than the clients
    held_by: str = ""  # what holds the rest back: "the KV pool", the client cap, "max_num_seqs"
    capacity_request_rate: float | None = None  # set where the rate exceeds what the replicas serve
    carries: list[str] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        return self.layout.gpus * self.replicas

    @property
    def throughput_per_gpu(self) -> float:
        return self.throughput / self.gpus


def predict_deployment(fitted: FittedAnchor, layout: Layout, isl: int, osl: int, *,
                       concurrency: int | None = None, request_rate: float | None = None, replicas: int = 1,
                       anchored: bool = True) -> DeploymentPrediction:
    """`fitted` at `layout` x `replicas`, under `concurrency` closed-loop clients or Poisson arrivals
    at `request_rate` (one of the two). `anchored` False: a measurement-free estimate, always
    flagged extrapolated. RequestTooLong when one request does not fit the KV pool."""
    if (concurrency is None) == (request_rate is None):
        raise UserError("give one of concurrency (closed-loop clients) or request_rate (requests/s)")
    cost = layout_cost(fitted.model, fitted.gpu, layout, fitted.precision, fitted.kv_dtype, fitted.engine,
                       fitted.engine_version)
    sched = engine_sched(fitted.engine, fitted.model, fitted.gpu, layout, fitted.precision,
                         fitted.engine_version, fitted.kv_dtype)
    if isl + osl > sched.kv_tokens:
        # vLLM would not start with such a --max-model-len, SGLang refuses the request.
        raise RequestTooLong(f"--isl {isl} --osl {osl}: one request needs {isl + osl:,} tokens of KV cache, and the "
                             f"pool holds {sched.kv_tokens:,} per engine core at {layout.label()} on "
                             f"{fitted.gpu.name}: no engine runs it; use more GPUs (tp), an fp8 KV cache, or shorter "
                             "requests (`inferasim memory` shows the pool)")
    running: int | None = None
    held_by = ""
    capacity: float | None = None
    if concurrency is not None:
        # The clients split as evenly as they go: `extra` replicas serve one more than the rest, and
        # a replica without a client serves nothing.
        base_share, extra = divmod(concurrency, replicas)
        shares = np.array([float(base_share + 1), float(max(base_share, 1))])
        counts = np.array([float(extra), float(replicas - extra if base_share else 0)])
        per_replica = base_share + 1 if extra else base_share
        bench = closed_loop(fitted.params, cost, sched, np.full(2, float(isl)), np.full(2, float(osl)), shares)
        # Means over requests: each replica weighs by the requests it completes.
        done = counts * bench.throughput
        ttft = float(np.sum(done * bench.ttft) / np.sum(done))
        tpot = float(np.sum(done * bench.tpot) / np.sum(done))
        tput = float(np.sum(done))
        stable = True
        i_big = 0 if extra else 1
        # Clients beyond what the KV pool (or max_num_seqs) runs at once queue for a slot: their
        # wait is in TTFT, and a reader should know it is a queue, not a slow prefill.
        in_flight = int(round(float(bench.running[i_big])))
        if in_flight < per_replica:
            running = in_flight
            if bool(bench.kv_limited[i_big]):
                held_by = "the KV pool"
            elif 0 < fitted.params.client_cap <= in_flight + 0.5:
                held_by = "the anchor's benchmark client (client_cap)"
            else:
                held_by = "max_num_seqs"
    else:
        assert request_rate is not None
        r = open_loop(fitted.params, cost, sched, np.array([isl]), np.array([osl]),
                      np.array([request_rate / replicas]))
        ttft, tpot, tput = float(r.ttft[0]), float(r.tpot[0]), float(r.throughput[0]) * replicas
        stable = bool(r.stable[0])
        # Held against the anchor's concurrency sweep: the requests in flight at this rate.
        per_replica = max(int(round(float(r.running[0]))), 1)
        if not stable:
            # Beyond capacity the queue grows without bound: the output rate is what the replicas
            # serve at their running cap, not the offered load, and TTFT has no steady value.
            capacity = float(r.capacity[0]) * replicas
    extrapolated = fitted.beyond_measured(per_replica, isl, osl) or not anchored
    s_tpot = fitted.spread(extrapolated, layout, isl, osl, "tpot", concurrency=per_replica)
    s_ttft = fitted.spread(extrapolated, layout, isl, osl, "ttft", concurrency=per_replica)
    s_tput = fitted.spread(extrapolated, layout, isl, osl, "throughput", concurrency=per_replica)
    has_tpot = osl > 1
    return DeploymentPrediction(
        layout=layout, replicas=replicas, isl=isl, osl=osl, concurrency=concurrency, request_rate=request_rate,
        ttft_ms=ttft * 1e3 if stable else None, tpot_ms=tpot * 1e3 if has_tpot else None, throughput=tput,
        stable=stable, extrapolated=extrapolated, per_replica=per_replica,
        ttft_interval=(ttft * 1e3 * math.exp(-s_ttft), ttft * 1e3 * math.exp(s_ttft)) if stable else None,
        tpot_interval=(tpot * 1e3 * math.exp(-s_tpot), tpot * 1e3 * math.exp(s_tpot)) if has_tpot else None,
        throughput_interval=(tput * math.exp(-s_tput), tput * math.exp(s_tput)),
        running_per_replica=running, held_by=held_by,
        capacity_request_rate=round(capacity, 4) if capacity is not None else None,
        carries=fitted.carries(layout, isl, osl, per_replica),
    )
