"""Steady-state estimator of the public benchmarks: closed loop and offline batch.

Closed loop (what `vllm bench serve --max-concurrency C` and the public data do): C clients,
each sends a request of `isl` random prompt tokens asking `osl` output tokens, and sends the next
one when it completes; no prefix reuse. Offline (vLLM `benchmark_latency` /
`benchmark_throughput`): B requests arrive at once, no refill.

The estimator solves the steady state in closed form per point, vectorised over numpy arrays of
points, so it can sit inside a fit and a search. The discrete-event simulator in
`inferasim.sim.des` replays the same benchmark request by request; the two agree within the
tolerances its tests state.

Scheduling follows the engine:
- vLLM V1's *mixed* batches: decodes first, the leftover `max_num_batched_tokens`
  goes to prefill chunks in the same step; a prefill adds its marginal compute to decode steps.
- *separate* prefill batches (SGLang, ATOM, vLLM V0): a prefill batch stops the decodes for
  its whole duration, host cost and weight read included.
In both, the extra wall time that prefills take out of each request's decode phase stretches
TPOT to T_decode / (1 - u), u = the share of time spent on prefill work.

Capacity: running requests are capped by `max_num_seqs` and by the KV pool, with the KV a
request needs at its end (isl + osl, in whole blocks); clients beyond the cap queue, and their
wait is part of TTFT (closed-loop Little's law: C = X x (wait + service)).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from inferasim.catalog.engines import SGLANG_MAX_PREFILL_TOKENS, engine_defaults, normalize_engine, release_of
from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import ModelSpec
from inferasim.core.layout import Layout
from inferasim.model.layoutcost import LayoutCost, layout_cost
from inferasim.model.memory import plan_memory
from inferasim.model.steptime import StepParams, step_time

# How fast the persisting share of a closed-loop arrival wave falls as the wave grows against the
# steady-state TTFT: share = burst x (1 + wave excess / steady TTFT)^-gamma. Mixed chunked steps
# (vLLM V1) hand out a long wave's first tokens chunk by chunk over many steps, so its clients
# come back spread out and the wave does not survive its own length; separate prefill batches
# (SGLang) release a batch's first tokens together and keep the wave. On shared/data/aic-silicon
# (min-gpus rule) the vLLM rows' implied share falls from about 0.6 to 0.2 as the wave grows
# from 2x to 40x the steady TTFT; gamma 0.25 was chosen among 0.1-0.5 (vLLM TTFT 16.3% -> 14.9%);
# for separate batches every gamma other than 0 made SGLang worse (-0.2 to +0.5 tried).
# Re-chosen once the model around it had settled (client cap, DSA caches, front-end costs): of the
# 1452 aggregated vLLM and SGLang rows (only vLLM's move), those within 13% TTFT by gamma 0.20 /
# 0.25 / 0.26 / 0.275 / 0.28 / 0.29 / 0.30 / 0.35 / 0.40 were 712 / 722 / 718 / 729 / 731 / 729 /
# 727 / 708 / 665 (vLLM TTFT 12.6% -> 12.4%); against 0.25, 0.28 did better on 6 of 8 random
# halves of the kernel sets. What it moves: 8192-token prompts at 64-512 clients, where a long
# wave spreads out more than 0.25 allowed.
WAVE_GAMMA_MIXED = 0.28
WAVE_GAMMA_SEPARATE = 0.0
# SGLang's overlap scheduler (srt/managers/scheduler.py, event_loop_overlap) reads a batch's results,
# first tokens included, only after it has launched the next batch. When the next batch is another
# prefill (eager kernels, not a captured graph) its launch waits behind the GPU, and the earlier
# batch's first tokens leave late: sgl-project/sglang PR #11856 added
# SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP for this, off by default through v0.5.10. Priced as this
# share of the next prefill batch for every batch of a wave but its last. Chosen with `inferasim
# validate` on shared/data/aic-silicon among 0-1: SGLang TTFT 18.5% at 0, 17.6-18.1% at 0.2-0.35,
# 19.0% at 1 (where the anchors' own TTFT fits best, 7.6% against 8.0% at 0.3).
SGLANG_CONSECUTIVE_PREFILL_DELAY = 0.3
# Share of a closed-loop wave that persists when SGLang prefills it one prompt per batch (a prompt
# as long as --max-prefill-tokens / 2 or more, or as the chunk size on a chunk-bound GPU): the
# wave's first tokens then leave a whole prefill apart instead of a batch's worth at once. On
# shared/data/aic-silicon, SGLang's TTFT at 8192-token prompts grows with clients at about half
# the rate a persisting wave gives, for every kernel set whose TPOT says its prefill time is
# priced right (Qwen3.5-397B bf16/fp4/fp8, DeepSeek-R1 fp4 on B200/B300), while batches of
# several prompts keep the whole wave (1024-token prompts; 2048 and 4096 on H100). The
# discrete-event schedulers, which follow the engine's rule, keep the whole wave: this is an
# empirical share, not a mechanism. Chosen among 0.3-1 with `inferasim validate` (SGLang TTFT
# 19.4% at 1, 14.2% at 0.5, 15.9% at 0.4, 15.0% at 0.6; overall 15.3, 13.4, 14.4, 13.7%). It
# also enters the TPOT, where the closed loop mixes wave (a persisting wave stalls its early
# requests' decode) and steady state. See sglang_wave_share for how it grows back for shorter
# prompts.
SGLANG_SINGLE_PROMPT_WAVE_SHARE = 0.5
FIXED_POINT_ITERATIONS = 12  # regula falsi steps for the steady-state rate (_steady_rate)
MIN_KV_TOKENS = 16384  # below this a benchmark of a few requests of a few thousand tokens cannot run
TIGHT_MEMORY_FRACTION = 0.95
MAX_PREFILL_SHARE = 0.95


@dataclass(frozen=True)
class EngineSched:
    """The scheduler limits that shape a benchmark, per attention-dp rank."""

    engine: str
    mixed: bool  # prefill chunks ride in decode steps (vLLM V1) or run apart (SGLang, ATOM, vLLM V0)
    max_num_seqs: int  # (an array of limits when the search evaluates many at once)
    max_batched_tokens: int  # per-step token budget (vLLM) / chunked prefill size (SGLang)
    kv_tokens: int  # KV pool of one dp rank, in tokens
    block_size: int
    # Prompt tokens one prefill batch may carry (SGLang --max-prefill-tokens; a separate cap from
    # the chunk size). vLLM has none beyond its step budget.
    max_prefill_tokens: int = SGLANG_MAX_PREFILL_TOKENS

    @property
    def prefill_chunk(self) -> int | np.ndarray:
        # Works on arrays too: the search evaluates many scheduler limits in one call.
        return np.maximum(self.max_batched_tokens, 256)


def engine_sched(engine: str, model: ModelSpec, gpu: GPU, layout: Layout, precision: str = "auto",
                 engine_version: str = "", kv_dtype: str = "auto", max_num_seqs: int | None = None,
                 max_batched_tokens: int | None = None) -> EngineSched:
    """The engine's scheduler limits and KV pool for a deployment (cached per deployment)."""
    return _engine_sched(normalize_engine(engine), model, gpu, layout, precision, engine_version, kv_dtype,
                         max_num_seqs, max_batched_tokens)


def rank_chunk(engine: str, max_batched_tokens: int | None, dp: int) -> int | None:
    """The per-rank token budget a `--chunked-prefill-size` / `--max-num-batched-tokens` flag gives:
    SGLang divides its chunk by dp_size under DP attention (S server_args
    _handle_data_parallelism); vLLM and ATOM budget each rank with the flag as it is."""
    if max_batched_tokens is None or engine != "sglang" or dp <= 1:
        return max_batched_tokens
    return max(int(max_batched_tokens) // int(dp), 1)


@functools.lru_cache(maxsize=4096)
def _engine_sched(engine: str, model: ModelSpec, gpu: GPU, layout: Layout, precision: str, engine_version: str,
                  kv_dtype: str, max_num_seqs: int | None, max_batched_tokens: int | None) -> EngineSched:
    engine_tp = layout.tp * layout.dp if engine == "sglang" else layout.tp
    d = engine_defaults(engine, gpu.hbm_bytes, tp=engine_tp, pp=layout.pp, dp_attention=layout.dp,
                        gpu_name=gpu.name)
    plan = plan_memory(model, gpu, layout, engine=engine, precision=precision, kv_dtype=kv_dtype,
                       max_num_batched_tokens=max_batched_tokens, max_num_seqs=max_num_seqs)
    if plan.kv_tokens < MIN_KV_TOKENS and plan.memory_fraction < TIGHT_MEMORY_FRACTION:
        # Deployments that only fit above the engine's default memory fraction are run with the
        # fraction raised by hand (--gpu-memory-utilization / --mem-fraction-static); price the
        # KV pool that such a deployment would have.
        plan = plan_memory(model, gpu, layout, engine=engine, precision=precision, kv_dtype=kv_dtype,
                           memory_fraction=TIGHT_MEMORY_FRACTION,
                           max_num_batched_tokens=max_batched_tokens, max_num_seqs=max_num_seqs)
    mixed = d.mixed_prefill_decode
    release = release_of(engine_version)
    if engine == "vllm" and release and release < (0, 7):
        # vLLM V0 (before 0.7) ran prefill and decode in separate steps unless chunked prefill
        # was asked for.
        mixed = False
    return EngineSched(
        engine=engine, mixed=mixed, max_num_seqs=max_num_seqs or d.max_num_seqs,
        max_batched_tokens=rank_chunk(engine, max_batched_tokens, layout.dp) or d.max_num_batched_tokens,
        kv_tokens=max(plan.kv_tokens, 0), block_size=max(d.block_size, 1),
        # The deployment renderer raises SGLang's --max-prefill-tokens with a larger chunk size
        # (the search's arrays of chunk sizes do the same in search.estimate).
        max_prefill_tokens=max(d.max_prefill_tokens, max_batched_tokens or 0),
    )


@dataclass(frozen=True)
class BenchResult:
    ttft: np.ndarray  # s, mean
    tpot: np.ndarray  # s, mean
    running: np.ndarray  # requests running at once (per replica)
    throughput: np.ndarray  # output tokens/s of the replica
    step_decode: np.ndarray  # s, decode-only step at the steady batch
    # s, the gap a prefill puts between two tokens of a request decoding on its rank: the mixed
    # step (chunked prefill) or a decode step plus the prefill batch (separate prefills)
    step_prefill: np.ndarray
    kv_limited: np.ndarray  # bool: the KV pool (not max_num_seqs, a client cap or the clients) set the batch

    def e2e_latency(self, osl: np.ndarray) -> np.ndarray:
        return self.ttft + (np.asarray(osl, dtype=float) - 1.0) * self.tpot


# Share of its output a running request holds in KV on average over its life (written uniformly).
MEAN_OUTPUT_HELD = 0.5


def _capacity(sched: EngineSched, isl: np.ndarray, osl: np.ndarray, kv_scale: float = 1.0) -> np.ndarray:
    blocks = np.ceil((isl + osl) / sched.block_size) * sched.block_size
    return np.maximum(np.floor(sched.kv_tokens * kv_scale / blocks), 1.0)


def _preemption_wait(p: StepParams, c: LayoutCost, sched: EngineSched, isl: np.ndarray, osl: np.ndarray,
                     b: np.ndarray, full: np.ndarray, t_dec: np.ndarray, grid: int = 16) -> np.ndarray:
    """Mean time per request lost to preemptions when `b` requests run on a rank whose pool holds
    `full` of them at full length. A closed loop of fixed lengths runs in step, so its KV grows
    from b x isl to b x (isl + osl) each cycle; once b x (isl + g) passes the pool at g tokens
    written, the engine preempts the newest request (vLLM V1 recompute, vllm/v1/core/sched/
    scheduler.py; SGLang retract_decode), one more each time the pool fills again. A request
    preempted at g waits while the others write their remaining osl - g tokens, then recomputes
    its isl + g tokens and writes its own rest: (osl - g) decode steps and one prefill later than
    it would have. A pool just short of the last request's tail (70B fp8 on one B200 at 64 x
    (1024 + 8192) tokens, 0.6% over) loses almost nothing; one short by whole requests loses
    nearly a cycle per preempted request, as a client waiting for a slot would. Charged to TTFT,
    as the wait for a slot is (the preempted requests' clients send their next request late)."""
    kv = sched.kv_tokens * p.kv_scale
    over = np.maximum(b - full, 0.0)
    total = np.zeros_like(np.asarray(b, dtype=float))
    for k in range(grid):
        n = b - over * (k + 0.5) / grid  # running count as the k-th slice of the overflow is preempted
        g = np.clip(kv / np.maximum(n, 1.0) - isl, 0.0, osl)
        tokens = isl + g
        t_pf = step_time(p, c, 0.0, 0.0, tokens, tokens / 2.0)
        total = total + ((osl - g) * t_dec + t_pf) * over / grid
    return total / np.maximum(b, 1.0)


def front_end_wait(t_front: np.ndarray | float, rate: np.ndarray | float,
                   wave: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """Time a request spends at the serial front end (service `t_front` each): outside waves its
    own service plus an M/D/1 wait at arrival `rate` (utilisation capped); in a wave of `wave`
    simultaneous arrivals, (wave + 1)/2 services on average."""
    rho = np.minimum(rate * t_front, MAX_PREFILL_SHARE)
    return t_front + rho * t_front / (2.0 * (1.0 - rho)), (wave + 1.0) / 2.0 * t_front


def _prefill_rate(p: StepParams, c: LayoutCost, sched: EngineSched, isl: np.ndarray) -> np.ndarray:
    """Tokens/s of one dp rank doing nothing but prefill in full chunks."""
    chunk = np.broadcast_to(np.asarray(sched.prefill_chunk, dtype=float), np.shape(isl)).copy()
    return chunk / step_time(p, c, 0.0, 0.0, chunk, isl / 2.0)


def sglang_wave_share(sched: EngineSched, new: np.ndarray) -> np.ndarray:
    """Factor on the persisting wave share of SGLang's closed loop for prompts of `new` tokens:
    SGLANG_SINGLE_PROMPT_WAVE_SHARE once a prompt has a prefill batch to itself, growing as
    (prompt at which batches start holding one) / prompt for shorter ones, up to 1. A step at that
    edge instead (2 prompts per batch -> 1) made predicted TTFT fall by 40-45% when a prompt grew
    by one token past it; the factor x prompt never falls, so the wave's excess, which grows with
    the prompt, does not either. Batches hold one prompt from --max-prefill-tokens / 2 where whole
    prompts are admitted (budget >= limit, see _sglang_wave), and from the chunk size where the
    chunk binds."""
    budget = np.asarray(sched.prefill_chunk, dtype=float)
    limit = np.asarray(sched.max_prefill_tokens, dtype=float)
    alone = np.where(budget >= limit, limit / 2.0, budget)
    s = SGLANG_SINGLE_PROMPT_WAVE_SHARE
    return np.clip(s * alone / np.maximum(np.asarray(new, dtype=float), 1.0), s, 1.0)


def _sglang_wave(p: StepParams, c: LayoutCost, sched: EngineSched, b: np.ndarray, new: np.ndarray,
                 ctx: np.ndarray, pos: np.ndarray, batches: np.ndarray, t_batch: np.ndarray,
                 total_batches: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SGLang's prefill batches in a wave of `b` prompts of `new` tokens: (mean batches a request
    waits for its first token, one batch's time, batches in the wave).

    PrefillAdder (srt/managers/schedule_policy.py, add_one_req) refuses every request after a
    batch's first whose prompt is >= the tokens left of --max-prefill-tokens. Where the chunk size
    is that large too (B200, B300, MI300-class defaults: 16384) a batch holds ceil(16384 / isl) - 1
    whole prompts and never splits the last: 15 prompts of 1024 tokens, one of 8192. A smaller
    chunk (H100: 8192) binds first, and batches are full chunks as the caller prices them. Every
    batch of the wave but the last hands its first tokens out late (SGLANG_CONSECUTIVE_PREFILL_DELAY).

    The wave's last batch is priced as a full one, although it may hold fewer prompts. That is an
    empirical choice, not the engine rule: SGLang's measured TTFT rises by some 60-75% from 8 to
    16 clients of 1024-token prompts on B200/B300 (shared/data/aic-silicon), as if the 16th
    prompt cost a whole second batch, and the discrete-event schedulers, which follow the rule
    (15 + 1), do not show it. Priced by the rule instead, the SGLang anchors' own TTFT fits 13.1%
    (median) instead of 8.0%, and `validate` gives SGLang TTFT 21.4% instead of 17.7%."""
    budget = np.asarray(sched.prefill_chunk, dtype=float)
    limit = np.asarray(sched.max_prefill_tokens, dtype=float)
    whole = (budget >= limit) & (new < limit)
    per_batch = np.where(whole, prompts_per_batch(sched, new), 1.0)
    n_whole = np.ceil(b / per_batch)
    t_whole = step_time(p, c, 0.0, ctx, np.minimum(per_batch, b) * new, pos)
    total = np.where(whole, n_whole, total_batches)
    waited = np.where(whole, (n_whole + 1.0) / 2.0, batches)
    # Only batches that hand out first tokens delay the next one's: a lone prompt's chunks do not.
    own = np.where(whole, 1.0, np.maximum(np.ceil(new / np.maximum(budget, 1.0)), 1.0))
    waited = waited + SGLANG_CONSECUTIVE_PREFILL_DELAY * np.maximum(1.0 - own / np.maximum(total, 1.0), 0.0)
    return waited, np.where(whole, t_whole, t_batch), total


def prompts_per_batch(sched: EngineSched, new: np.ndarray) -> np.ndarray:
    """Whole prompts of `new` tokens one separate prefill batch holds. SGLang's PrefillAdder
    (srt/managers/schedule_policy.py, add_one_req) refuses every request after a batch's first
    whose prompt is >= the tokens left of --max-prefill-tokens: where the chunk size is that large
    too (B200, B300, MI300-class defaults: 16384) a batch holds ceil(16384 / isl) - 1 whole prompts
    and never splits the last. Otherwise (a smaller chunk, vLLM V0's token budget) the budget
    binds: as many whole prompts as fit in it, at least one."""
    new = np.maximum(np.asarray(new, dtype=float), 1.0)
    budget = np.asarray(sched.prefill_chunk, dtype=float)
    limit = np.asarray(sched.max_prefill_tokens, dtype=float)
    by_budget = np.maximum(np.floor(budget / new), 1.0)
    if sched.engine != "sglang":
        return by_budget
    whole = (budget >= limit) & (new < limit)
    return np.where(whole, np.maximum(np.ceil(limit / new) - 1.0, 1.0), by_budget)


def _steady_rate(running: np.ndarray, dp: int, osl: np.ndarray, t_dec: np.ndarray, lead: np.ndarray,
                 p_one: np.ndarray, p_full: np.ndarray, k_max: np.ndarray, others: np.ndarray | float = 1.0
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steady state of a closed loop of `running` requests: (rate x, prefill share u of a rank's
    time, duration P of the prefill batch a request rides in).

    Prefill work reaches each rank in batches. Separate prefill batches (SGLang) take every prompt
    waiting at a step boundary, so a batch holds the k prompts that arrived during the previous
    batch and one decode step, k = lam x (P(k) + t_dec) within [1, k_max] (lam = x / dp), and lasts
    P(k), linear between one prompt (`p_one`) and a full batch of k_max (`p_full`): the prompts
    share a batch's fixed cost (host, weight read). Mixed engines pass k_max = 1 and a request's
    marginal prefill time. u = lam P / k; TPOT = t_dec / (1 - u); a request waits `lead` (to the
    next step boundary, plus the decode steps its chunks ride in; not stretched by 1 / (1 - u),
    which made vLLM's TTFT on shared/data/aic-silicon worse, 13.2% -> 13.4%), an M/D/1 wait for
    the prefill server (customers: batches), and its own batch. x solves x = running / (TTFT +
    (osl - 1) TPOT): the right side falls as x grows, so the root is unique and a bracketing solver
    finds it (a damped fixed-point iteration flipped between two states near prefill saturation).
    12 Illinois steps agree with 64 bisections to 4e-11 on every row of shared/data/aic-silicon."""
    slope = (p_full - p_one) / np.maximum(k_max - 1.0, 1e-9)  # seconds one more prompt adds

    def state(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lam = x / dp
        grow = lam * slope
        k = np.where(grow < 1.0, lam * (p_one - slope + t_dec) / np.maximum(1.0 - grow, 1e-12), k_max)
        k = np.clip(k, 1.0, k_max)
        batch = p_one + slope * (k - 1.0)
        u = np.minimum(lam * batch / k, MAX_PREFILL_SHARE)
        uq = u * others
        cycle = lead + batch + uq * batch / (2.0 * (1.0 - uq)) + (osl - 1.0) * t_dec / (1.0 - u)
        return cycle, u, batch

    # g(x) = running / cycle(x) - x falls from g(0) > 0 to g(hi) <= 0, hi = the rate with no
    # prefill share. The Illinois variant of regula falsi keeps that bracket and converges
    # superlinearly: a fixed number of steps, vectorised over every point (the fit calls this
    # thousands of times on short arrays, where each numpy call costs more than its arithmetic).
    lo = np.zeros(np.broadcast(running, osl, t_dec, lead, p_one, p_full, k_max).shape)
    g_lo = running / state(lo)[0]
    hi = g_lo.copy()
    g_hi = running / state(hi)[0] - hi
    side = np.zeros(lo.shape)
    for _ in range(FIXED_POINT_ITERATIONS):
        x = np.where(g_lo - g_hi > 0, (lo * g_hi - hi * g_lo) / np.minimum(g_hi - g_lo, -1e-300), 0.5 * (lo + hi))
        x = np.clip(x, lo, hi)
        g = running / state(x)[0] - x
        up = g > 0  # the root lies above x
        lo, g_lo = np.where(up, x, lo), np.where(up, g, g_lo)
        hi, g_hi = np.where(up, hi, x), np.where(up, g_hi, g)
        # Illinois: halve the stale end's value when the same end moved twice in a row.
        g_hi = np.where(up & (side > 0), 0.5 * g_hi, g_hi)
        g_lo = np.where(~up & (side < 0), 0.5 * g_lo, g_lo)
        side = np.where(up, 1.0, -1.0)
    x = np.where(np.abs(g_lo) < np.abs(g_hi), lo, hi)
    _, u, batch = state(x)
    return x, u, batch


def closed_loop(p: StepParams, c: LayoutCost, sched: EngineSched, isl: np.ndarray, osl: np.ndarray,
                concurrency: np.ndarray, hit: np.ndarray | float = 0.0, min_running: float = 1.0) -> BenchResult:
    """`hit` is the prefix-cache hit share of each prompt: only the rest is computed (at the
    context of the cached prefix), but the KV the request holds is the whole prompt.
    `min_running`: the fewest requests in flight priced. A closed loop has at least one client;
    open_loop passes less, for Poisson arrivals at a low rate: the loop then runs at that rate
    (its prefills interfere with others' decodes in proportion) and a request decodes in steps
    that hold at least itself."""
    isl = np.asarray(isl, dtype=float)
    new = np.maximum(isl * (1.0 - np.asarray(hit, dtype=float)), 1.0)
    pos = isl - new / 2.0  # mean context of the computed prompt tokens
    osl = np.asarray(osl, dtype=float)
    conc = np.asarray(concurrency, dtype=float)
    dp = c.layout.dp
    # Engines allocate KV as tokens are computed and preempt (vLLM: recompute) or retract (SGLang)
    # when the pool runs short, so the pool bounds the running set by what requests hold on
    # average, half their output written (MEAN_OUTPUT_HELD), not by their full length; running
    # beyond what fits at full length pays preemptions near the end of each cycle (_preemption_wait).
    kv_full = _capacity(sched, isl, osl, p.kv_scale) * dp
    kv_cap = _capacity(sched, isl, MEAN_OUTPUT_HELD * osl, p.kv_scale) * dp
    cap = np.minimum(kv_cap, sched.max_num_seqs * dp)
    if p.client_cap > 0:
        # The client holds requests beyond its connection limit back; they wait as the KV queue's do.
        cap = np.minimum(cap, p.client_cap)
    running = np.maximum(np.minimum(conc, cap), min_running)
    b = running / dp
    # Decodes in a step a request decodes in: below one in flight, the request itself.
    b_step = np.maximum(b, 1.0) if min_running < 1.0 else b
    ctx = isl + osl / 2.0
    t_dec = step_time(p, c, b_step, ctx)
    if sched.mixed:
        chunk = np.clip(sched.max_batched_tokens - b_step, 64.0, None)
        chunk = np.minimum(chunk, new)
        t_mix = step_time(p, c, b_step, ctx, chunk, pos)
        per_token = np.maximum(t_mix - t_dec, 0.0) / chunk
        p_req = new * per_token  # marginal prefill time one request adds to the rank
        n_chunks = np.ceil(new / chunk)
        # Half a step to the next step boundary, then one step per chunk, each carrying its
        # chunk's marginal compute.
        lead = (0.5 + n_chunks) * t_dec
        p_full, k_max = p_req, np.ones_like(p_req)
    else:
        chunk = np.minimum(np.asarray(sched.prefill_chunk, dtype=float), new)
        full = np.floor(new / chunk)
        rest = new - full * chunk
        p_req = full * step_time(p, c, 0.0, 0.0, chunk, pos) + \
            np.where(rest > 0, step_time(p, c, 0.0, 0.0, np.maximum(rest, 1.0), pos), 0.0)
        lead = 0.5 * t_dec
        k_max = np.maximum(np.minimum(prompts_per_batch(sched, new), b), 1.0)
        p_full = np.where(k_max > 1.0, step_time(p, c, 0.0, 0.0, k_max * new, pos), p_req)
    # A request queues behind the prefills of the other requests on its rank, not its own: a
    # closed loop of b clients per rank has b - 1 others; Poisson arrivals (open_loop) all others.
    others = np.clip((b - 1.0) / np.maximum(b, 1.0), 0.0, 1.0) if min_running >= 1.0 else 1.0
    x, u, p_batch = _steady_rate(running, dp, osl, t_dec, lead, p_req, p_full, k_max, others)
    tpot = t_dec / (1.0 - u)
    uq = u * others
    ttft = lead + p_batch + uq * p_batch / (2.0 * (1.0 - uq))  # M/D/1 queue for the prefill server
    # Wave arrivals: with fixed isl/osl the clients of a closed loop start together and keep
    # finishing together, so requests reach the engine in waves of up to `b` per rank. A wave's
    # prompts go through in batches of the prefill budget S; a request's first token leaves when
    # its batch ends, so the mean request waits a(b+1)/2 + 1/2 batches (a = isl/S). `burst` is
    # the share of requests that see the wave (1: perfectly synchronised clients; less once the
    # waves have spread out).
    budget = np.maximum(sched.max_batched_tokens - (b / 2.0 if sched.mixed else 0.0), 64.0)
    a = new / budget
    batches = np.maximum(a * (b + 1.0) / 2.0 + 0.5, 1.0)
    t_batch = step_time(p, c, b / 2.0 if sched.mixed else 0.0, ctx, np.minimum(budget, b * new), pos)
    total_batches = np.maximum(np.ceil(b * new / budget), 1.0)
    # Batches one prompt needs on its own: a wave of one prompt in several chunks is no wave.
    own_batches = np.maximum(np.ceil(new / budget), 1.0)
    if sched.engine == "sglang":
        batches, t_batch, total_batches = _sglang_wave(p, c, sched, b, new, ctx, pos, batches, t_batch,
                                                       total_batches)
    ttft_wave = 0.5 * t_dec + batches * t_batch
    # Serial front end (`t_front`): one process admits requests one at a time. In a wave of R
    # arrivals the k-th waits k x t_front (mean (R + 1)/2 x t_front); outside waves a request
    # queues behind others at the front end's arrival rate x (M/D/1, utilisation capped).
    front_steady, front_wave = front_end_wait(p.front_time(isl), x, running)
    steady_part = ttft + front_steady + p.t_ttft
    # A lone client has no wave-mates: its excess fades in from one request per rank to two.
    alone = np.clip(b - 1.0, 0.0, 1.0)
    wave_excess = alone * np.maximum(ttft_wave + front_wave - ttft - front_steady, 0.0)
    gamma = WAVE_GAMMA_MIXED if sched.mixed else WAVE_GAMMA_SEPARATE
    share = p.burst * np.power(1.0 + wave_excess / steady_part, -gamma)
    if sched.engine == "sglang":
        share = share * np.where(total_batches > own_batches, sglang_wave_share(sched, new), 1.0)
    ttft_running = steady_part + share * wave_excess
    # In a wave, a request that got its first token early decodes while the rest of its wave is
    # prefilled: whole prefill batches stall it (separate batches), or their chunks slow its
    # steps (mixed). No later arrivals interrupt it: every client of the wave is busy. The
    # steady-state stretch T_dec / (1 - u) applies to the share of requests outside waves.
    per_batch_stall = t_batch if not sched.mixed else np.maximum(t_batch - step_time(p, c, b / 2.0, ctx), 0.0)
    stall = np.maximum(total_batches - own_batches, 0.0) / 2.0 * per_batch_stall
    tpot_wave = t_dec + stall / np.maximum(osl - 1.0, 1.0)
    tpot = (1.0 - share) * tpot + share * tpot_wave
    if sched.mixed:
        # Prefill-bound: a step holds at most the token budget, so prompts are admitted no faster
        # than (budget - decodes) / isl per step. In that regime most running requests wait for
        # their prefill, and only n = budget (osl - 1) / (isl + osl - 1) decode in each step (the
        # decoders a step's prompt share keeps busy for osl - 1 steps). The loop then cycles at the
        # budget's prompt rate, every step is one full mixed step, TPOT that step, and the rest of
        # the cycle waits for prefill, in TTFT. The stretch T_dec / (1 - u) above counts every
        # running request as decoding and would put that queue in TPOT instead.
        full = np.maximum(np.asarray(sched.max_batched_tokens, dtype=float), 64.0)
        n_sat = np.minimum(full * (osl - 1.0) / (new + osl - 1.0), b)
        t_sat = step_time(p, c, n_sat, ctx, full - n_sat, pos)
        cycle_sat = running / (dp * (full - n_sat) / (new * t_sat))
        # The longer cycle is the one that binds; TPOT never exceeds the full step (either bound
        # turning on moves time between TPOT and TTFT without a jump).
        cycle = np.maximum(cycle_sat, ttft_running + (osl - 1.0) * tpot)
        tpot = np.minimum(tpot, t_sat)
        ttft_running = cycle - (osl - 1.0) * tpot
    # Clients beyond the running cap wait for a slot. The running set completes running / cycle
    # requests per second, cycle = everything a request spends once admitted; closed-loop Little's
    # law over the clients, C = X x (wait + cycle), gives the wait. Past the cap the throughput stays
    # that of the running set however many clients queue.
    ttft_running = ttft_running + _preemption_wait(p, c, sched, isl, osl, b, kv_full / dp, t_dec)
    cycle = ttft_running + (osl - 1.0) * tpot
    admission_wait = np.maximum(conc / running - 1.0, 0.0) * cycle
    ttft_mean = ttft_running + admission_wait
    throughput = np.maximum(conc, 1.0) / (ttft_mean + (osl - 1.0) * tpot) * osl
    gap = t_mix if sched.mixed else t_dec + p_full
    return BenchResult(ttft=ttft_mean, tpot=tpot, running=running, throughput=throughput, step_decode=t_dec,
                       step_prefill=np.broadcast_to(gap, np.shape(tpot)), kv_limited=(kv_cap <= cap) & (cap < conc))


@dataclass(frozen=True)
class OfflineResult:
    batch_latency: np.ndarray  # s, all requests done
    throughput: np.ndarray  # output tokens/s
    ttft: np.ndarray
    tpot: np.ndarray


def offline_batch(p: StepParams, c: LayoutCost, sched: EngineSched, isl: np.ndarray, osl: np.ndarray,
                  batch: np.ndarray) -> OfflineResult:
    """B requests at once, no refill. Requests beyond what the KV pool holds run in later waves
    (vLLM preempts and recomputes; waves are the steady equivalent)."""
    isl = np.asarray(isl, dtype=float)
    osl = np.asarray(osl, dtype=float)
    bsz = np.asarray(batch, dtype=float)
    dp = c.layout.dp
    cap = np.minimum(_capacity(sched, isl, osl, p.kv_scale), sched.max_num_seqs) * dp
    full_waves = np.floor(bsz / cap)
    rest = bsz - full_waves * cap
    rate = _prefill_rate(p, c, sched, isl)

    def wave(n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        per_rank = np.maximum(n / dp, 1.0)
        t_pref = per_rank * isl / rate
        # Decode steps see context grow from isl to isl + osl: the mean context is exact for a
        # step time linear in context.
        t_step = step_time(p, c, per_rank, isl + osl / 2.0)
        return t_pref + (osl - 1.0) * t_step, t_pref, t_step

    t_full, pref_full, step_full = wave(cap)
    t_rest, _, _ = wave(np.maximum(rest, 1.0))
    latency = full_waves * t_full + np.where(rest > 0, t_rest, 0.0)
    throughput = bsz * osl / latency
    # The batch passes the serial front end one request at a time (see closed_loop).
    # Offline runs hand the engine token ids (vLLM benchmark_latency / _throughput): nothing is
    # tokenised, so only the per-request part (t_front) applies, as in sim.des.simulate_offline.
    ttft = pref_full / 2.0 + (np.minimum(bsz, cap) + 1.0) / 2.0 * p.t_front
    return OfflineResult(batch_latency=latency, throughput=throughput, ttft=ttft, tpot=step_full)


def predict_closed(model: ModelSpec, gpu: GPU, layout: Layout, engine: str, params: StepParams,
                   isl: int, osl: int, concurrency: int, precision: str = "auto",
                   engine_version: str = "") -> BenchResult:
    """One closed-loop point for one deployment (convenience for the CLI and tests)."""
    c = layout_cost(model, gpu, layout, precision, engine=normalize_engine(engine))
    sched = engine_sched(engine, model, gpu, layout, precision, engine_version)
    return closed_loop(params, c, sched, np.array([isl]), np.array([osl]), np.array([concurrency]))


@dataclass(frozen=True)
class OpenLoopResult:
    ttft: np.ndarray
    tpot: np.ndarray
    running: np.ndarray
    throughput: np.ndarray
    stable: np.ndarray  # False when the rate reaches what the replica can serve
    capacity: np.ndarray  # requests/s the replica serves with every running slot busy


OPEN_LOOP_BISECTIONS = 30
OPEN_LOOP_MIN_RUNNING = 1e-4  # requests in flight: the lowest load the bisection resolves


def open_loop(p: StepParams, c: LayoutCost, sched: EngineSched, isl: np.ndarray, osl: np.ndarray,
              rate: np.ndarray) -> OpenLoopResult:
    """Poisson arrivals at `rate` requests/s to one replica: the number running R follows from
    Little's law, R = rate x (TTFT + (osl - 1) TPOT), solved on the closed-loop model without its
    wave term (Poisson arrivals do not come in waves). The replica's capacity is the rate of the
    closed loop with every running slot busy. Below it a root lies between no request and the cap
    (rate x cycle(R) - R changes sign there), and bisection finds it, fractional below one request.
    At or above capacity the queue grows without bound: stable False, figures at the cap."""
    isl = np.asarray(isl, dtype=float)
    osl = np.asarray(osl, dtype=float)
    lam = np.asarray(rate, dtype=float)
    shape = np.broadcast(isl, osl, lam).shape
    isl, osl, lam = (np.broadcast_to(a, shape).astype(float) for a in (isl, osl, lam))
    cap = np.broadcast_to(np.minimum(_capacity(sched, isl, osl, p.kv_scale), sched.max_num_seqs) * c.layout.dp,
                          shape).astype(float)
    # Poisson arrivals come in no waves and through no benchmark client's connection limit.
    no_wave = p.without_harness()

    def cycle(running: np.ndarray) -> tuple[np.ndarray, BenchResult]:
        res = closed_loop(no_wave, c, sched, isl, osl, running, min_running=OPEN_LOOP_MIN_RUNNING)
        return res.ttft + (osl - 1.0) * res.tpot, res

    full_cycle, _ = cycle(cap)
    capacity = cap / full_cycle
    stable = lam < capacity
    lo = np.full(shape, OPEN_LOOP_MIN_RUNNING)
    hi = cap.copy()
    for _ in range(OPEN_LOOP_BISECTIONS):
        mid = 0.5 * (lo + hi)
        t, _ = cycle(mid)
        short = lam * t > mid  # more arrive during a request's stay than are running: R is larger
        lo = np.where(short, mid, lo)
        hi = np.where(short, hi, mid)
    running = np.where(stable, 0.5 * (lo + hi), cap)
    service, res = cycle(running)
    # Arrivals that find every running slot taken (KV pool or max_num_seqs) wait for one: an M/D/c
    # queue with c = the slots, each held for the request's stay (Allen-Cunneen: the M/M/c wait
    # x (1 + 0) / 2 for deterministic stays). Negligible with hundreds of slots below saturation;
    # a pool of two requests at 70% load waits more than a stay.
    wait = np.where(stable, slot_wait(cap, running, service), 0.0)
    return OpenLoopResult(ttft=res.ttft + wait, tpot=res.tpot, running=running,
                          throughput=np.minimum(lam, capacity) * osl, stable=stable, capacity=capacity)


def _servers_and_load(servers: np.ndarray, load: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whole servers (at least one) and an offered load kept just below them, broadcast together."""
    c = np.maximum(np.floor(np.asarray(servers, dtype=float)), 1.0)
    a = np.minimum(np.asarray(load, dtype=float), c * (1.0 - 1e-9))
    c, a = np.broadcast_arrays(c, a)
    return c, a


def erlang_c(servers: np.ndarray, load: np.ndarray) -> np.ndarray:
    """Probability that a Poisson arrival waits in an M/M/c queue of `servers` (floored to whole
    servers, at least one) at offered `load` (erlangs, below `servers`): Erlang B by its
    recursion B(k) = a B(k-1) / (k + a B(k-1)), then C = c B / (c - a (1 - B))."""
    c, a = _servers_and_load(servers, load)
    erlang_b = np.ones(c.shape)
    for k in range(1, int(c.max()) + 1):
        step = a * erlang_b / (k + a * erlang_b)
        erlang_b = np.where(k <= c, step, erlang_b)
    return c * erlang_b / (c - a * (1.0 - erlang_b))


def slot_wait(slots: np.ndarray, load: np.ndarray, stay: np.ndarray) -> np.ndarray:
    """Mean wait for one of `slots` running slots, each held `stay` s, at `load` requests in flight."""
    c, a = _servers_and_load(slots, load)
    return erlang_c(c, a) * np.asarray(stay, dtype=float) / (c - a) / 2.0
