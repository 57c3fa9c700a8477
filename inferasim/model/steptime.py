"""The step-time model of one engine iteration (DESIGN.md section 3).

One iteration runs `n_d` decode sequences at mean context `ctx_d` and `n_p` prefill tokens at
mean context `ctx_p`, on every GPU of one replica. Its time is

    T = T_host                       fixed per step + per sequence (launch, sync, sampling, scheduling)
      + roof(bytes_dense / BW_w, flops_dense / F)          attention/dense/shared projections, LM head
      + roof(bytes_experts_touched / BW_w, flops_experts / F)   routed experts of the busiest GPU
      + KV bytes read by decode / BW_kv + prefill attention FLOPs / F_attn
      + collectives per layer: alpha(link, ranks) + bytes x 2(r-1)/r / link bandwidth

where `roof` is a smooth maximum (memory- vs compute-bound), and BW_w, BW_kv, F, F_attn are the
GPU's peaks times fitted efficiencies. The host part is kept apart from the GPU-divisible part:
that is what makes transfer to another layout honest (DESIGN.md section 1, point 3).

Everything here is vectorised over numpy arrays of batch descriptions so that the closed-loop
estimator and the fit stay fast. What one GPU of a layout does per step, whatever the batch (bytes,
FLOPs, KV per token, collectives), is `inferasim.model.layoutcost.LayoutCost`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from inferasim.catalog.engines import allreduce_hop_latency, vllm_v0
from inferasim.catalog.gpus import GPU
from inferasim.model.layoutcost import ArrayLike, LayoutCost

# Smoothness of the roofline maximum: (m^p + c^p)^(1/p). p = 4 is within 19% of max() at the
# ridge and within 1% a factor 2 away from it; a kink-free roof keeps the fit well-behaved.
ROOF_P = 4.0


def roof(mem: ArrayLike, comp: ArrayLike) -> ArrayLike:
    return (np.power(mem, ROOF_P) + np.power(comp, ROOF_P)) ** (1.0 / ROOF_P)


# ------------------------------------------------------------------------------------------------
# Parameters
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepParams:
    """Fitted (or default) parameters of one kernel set. Efficiencies are fractions of peak."""

    t_fixed: float = 4e-3  # s per step: launch/sync/scheduling that no GPU count divides
    t_seq: float = 2e-5  # s per running sequence per step (sampling, input prep, detokenise)
    e_bw: float = 0.80  # weight-streaming efficiency (fraction of HBM peak)
    e_kv: float = 0.55  # decode attention KV-read efficiency
    e_flops: float = 0.55  # GEMM efficiency at large token counts and widths (see gemm_shape)
    e_attn: float = 0.40  # prefill attention efficiency (flash attention vs dense peak)
    moe_skew: float = 0.15  # router skew: busiest-rank load excess over uniform routing
    comm_scale: float = 1.0  # multiplier on the link model's collective time
    burst: float = 0.50  # share of wave-mates' prefill a closed-loop request waits for (model.steady)
    t_ttft: float = 0.03  # s per request outside the steps: API server, tokenise, first-token stream
    kv_scale: float = 1.0  # KV pool actually usable / memory-model estimate (KV dtype, preemption)
    # s per request served one at a time by the engine's front end (SGLang's TokenizerManager and
    # scheduler admission, vLLM's API server process): a burst of C arrivals waits k x t_front for
    # its k-th request. Host cost: no layout divides it. Old anchors without it load as 0. Priced by
    # model.steady and transfer.disagg_point; simulated (sim.des, sim.replica) and emulated as one FIFO server.
    t_front: float = 0.0
    # s per prompt token added to each request's turn at that serial front end: vLLM's API server
    # tokenises and processes the whole prompt in one process before the engine core sees it. On
    # shared/data/aic-silicon the part of vLLM's TTFT that no tp divides grows by about 1 ms per
    # client at 1024-token prompts and 7-8 ms at 8192 (Llama-3.1-70B, MiniMax-M2.5, Qwen3-32B over
    # tp 1-8), about 1-2 us per prompt token. Fitted only where an anchor spans prompt lengths.
    t_front_token: float = 0.0
    # Requests the benchmark client keeps in flight at most, whatever its --max-concurrency (0: no
    # limit). Not a property of the engine: a client whose HTTP pool caps its connections (aiohttp's
    # TCPConnector allows 100 by default, which older `vllm bench serve` clients kept; vllm issues
    # #7241, #14513) holds the rest back, and their wait is in the TTFT it reports. Found from an
    # anchor's own points (fit.client_cap_of), never a prior; model.steady and sim.des apply it.
    client_cap: float = 0.0
    # GEMM rows (tokens) a kernel serves per pass over the weights. A GEMM kernel tiles its M rows;
    # a tuned one covers a whole decode batch in one tile and reads each weight once per step, so
    # the default (65536 rows) leaves the step as it was. Kernels built for skinny shapes and used
    # beyond them stay memory-bound and stream the weights again for every tile: the weight traffic
    # of a step grows as 1 + tokens / m_tile. vLLM 0.6 on MI300X shows it: batch latency of fp16
    # Llama-2, Mistral and Mixtral grows linearly with the batch from 16 sequences up at every tp,
    # by a per-sequence time proportional to the weights each GPU holds (Llama-2-70B 4.0 ms / tp,
    # Llama-2-7B 0.26 ms: a pass every 7-10 rows), where a compute roof at any efficiency would
    # bend. Fitted from an anchor's batch sweep; it moves with the per-GPU weights to other layouts.
    m_tile: float = 65536.0
    # s per step of host work that only a tensor-parallel deployment (tp > 1) has. vLLM's V0 engine
    # broadcasts each step's inputs and metadata from the driver worker to the other tp workers
    # before the model runs (V0 LocalOrDistributedWorkerBase.execute_model: broadcast_tensor_dict over
    # the tp group), on the step's critical path. A tp-1 anchor cannot see it and a tp>1 anchor
    # cannot tell it from t_fixed, so it is a prior by engine generation (default_params), never fitted.
    t_tp: float = 0.0
    # s added to every latency hop of the tensor-parallel all-reduces beyond the link's own
    # (LayoutCost.allreduce_hops): the engine's all-reduce path, part of the kernel set. An engine
    # build that reduces through RCCL or NCCL rather than its own one-shot kernel pays the library's
    # launch and protocol latency per collective (catalog.engines.allreduce_hop_latency). A prior by
    # kernel set, never fitted (one layout cannot tell it from t_fixed).
    t_hop: float = 0.0

    def host_time(self, n_dec: ArrayLike, tp: int) -> ArrayLike:
        """Host seconds of a step with `n_dec` running sequences at tensor width `tp`: what no GPU
        count divides."""
        return self.t_fixed + self.t_seq * np.asarray(n_dec, dtype=float) + (self.t_tp if tp > 1 else 0.0)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def without_harness(self) -> StepParams:
        """These parameters for traffic other than the benchmark that measured the anchor: no
        lock-stepped arrival waves (`burst`) and no client cap on requests in flight (`client_cap`)."""
        return replace(self, burst=0.0, client_cap=0.0)

    def front_time(self, isl: ArrayLike) -> ArrayLike:
        """Seconds one request holds the serial front end (`t_front` + `t_front_token` x prompt)."""
        return self.t_front + self.t_front_token * np.asarray(isl, dtype=float)

    @classmethod
    def from_dict(cls, d: dict[str, float]) -> StepParams:
        known = {k: float(v) for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def param_error(name: str, value: object) -> str | None:
    """Why `value` cannot be step-time parameter `name` (None when it can): an unknown name, not a
    finite number, an efficiency outside (0, 1] of peak, or a negative time or factor. Looser than
    the fit's PARAM_BOUNDS on purpose: a stored anchor or an emulator may go beyond what a fit picks,
    but never where the step model stops meaning anything (a zero efficiency divides by zero, a
    negative host cost gives negative latencies)."""
    if name not in StepParams.__dataclass_fields__:
        return f"unknown step-time parameter {name!r}; known: {', '.join(StepParams.__dataclass_fields__)}"
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return f"{name} must be a number, got {value!r}"
    if name.startswith("e_") and not 0.0 < value <= 1.0:
        return f"{name}={value} must be within (0, 1] (a fraction of the GPU's peak)"
    if value < 0 or (name == "kv_scale" and value == 0):
        return f"{name}={value} must be positive"
    return None


# Bounds of the fit: efficiencies in (0, 1] of the rate a kernel can reach (the dtype's peak; for
# block-scaled FP8 GEMMs, BLOCK_FP8_RATE x the BF16 peak), host costs within what engines show.
PARAM_BOUNDS: dict[str, tuple[float, float]] = {
    "t_fixed": (2e-4, 6e-2),
    "t_seq": (0.0, 5e-4),
    "e_bw": (0.25, 1.0),
    "e_kv": (0.08, 1.0),
    "e_flops": (0.08, 1.0),
    "e_attn": (0.05, 1.0),
    "moe_skew": (0.0, 2.0),
    "comm_scale": (0.25, 4.0),
    "burst": (0.0, 1.0),
    "t_ttft": (0.0, 0.5),
    "kv_scale": (0.4, 3.0),
    "t_front": (0.0, 0.05),
    "t_front_token": (0.0, 2e-5),
    "m_tile": (1.0, 65536.0),
    "t_tp": (0.0, 2e-2),
    "t_hop": (0.0, 1e-3),
}

# GEMM shape efficiency: a GEMM of M tokens by N output columns per GPU reaches
# 1 / (1 + GEMM_M0 / M + GEMM_N0 / N) of the fitted large-GEMM efficiency: tile quantisation, and
# the activation read that a narrow N does not amortise. It is what makes prefill stop scaling
# as 1/tp once tp or moe_tp leaves each GPU a thin slice (MiniMax-M2.5's experts are 768 columns
# wide at moe_tp 4), and grouped expert GEMMs slow when few tokens reach each expert. The
# anchor's e_flops is fitted at its own shapes; the factor carries it to the target's. Chosen on
# shared/data/aic-silicon (min-gpus) among M0 0-128 and N0 0-1024: M0 64, N0 384 moved TPOT
# 7.6% -> 7.2%, throughput/GPU 7.2 -> 6.9, overall TTFT 16.2 -> 16.1 (vLLM 14.5 -> 13.8, SGLang
# 20.2 -> 20.4), argonne offline latency 10.3 -> 10.0 (N0 512: pair accuracy 0.990 but SGLang
# TTFT 22.0).
GEMM_M0 = 64.0
GEMM_N0 = 384.0

# Revision of the step-time model: what a stored anchor's parameters mean. Bump it whenever a
# change gives the same parameters another meaning (a rate, a shape law, a default the fit leans
# on), so that anchors fitted before are refitted from their own points when read
# (predictor.fitted_from_anchor) instead of being read against the new model. Anchors record it
# in fit.step_model. 2026-12-03: block-scaled FP8 GEMMs at the BF16 rate, FP4 without FP4 tensor
# cores at the BF16 rate. 2026-12-03.2: a closed-loop request queues behind the prefills of the
# other clients on its rank, not its own (model.steady.closed_loop), which moves t_ttft and burst.
# 2026-12-03.3: vLLM's prefill attention at the FP8 rate on Blackwell with an FP8 KV cache
# (catalog.engines.prefill_attention_dtype), which moves e_attn and the prefill share.
# 2026-12-03.4: pipeline stages keep min(pp, sequences) micro-batches in flight (step_time).
# 2026-12-03.5: DeepSeek sparse attention (GLM-5, DeepSeek-V3.2): decode reads the latent of the
# top-k keys only; prefill past the engine's dense limit runs the padded sparse MLA kernel.
# 2026-12-03.6: a DSA layer's cache in its own format (FP8: FlashMLA's 656-byte latent, plus the
# 132-byte FP8 index key in every dtype), which moves e_kv of DSA kernel sets.
# 2026-12-03.7: a mixed-batch wave's persisting share decays with gamma 0.28, not 0.25
# (model.steady.WAVE_GAMMA_MIXED), which moves the burst and t_ttft that vLLM anchors fit.
# 2026-12-04: AMD and vLLM V0 physics (shared/data/argonne-offline): a weight tile (m_tile, fitted
# from a batch sweep), vLLM V0's host time per sequence (T_SEQ_V0) and per tp step (t_tp), RCCL's
# all-reduce latency where vLLM reduced through it (t_hop), the generic ROCm decode kernel's reads
# per query head over MI300X's XCDs (kv_read_amp), and first-run points left out of a fit.
# 2026-12-05: the closed loop's KV admission: running requests hold their prompt and half their
# output, those beyond what fits at full length pay preemptions (model.steady._preemption_wait);
# moves burst, t_ttft and t_fixed of anchors whose sweeps ran the pool short.
STEP_MODEL_REVISION = "2026-12-05"

# vLLM V0's host time per running sequence per step (see default_params).
T_SEQ_V0 = 1e-4
# vLLM V0's per-step broadcast to its tp workers (StepParams.t_tp).
# Chosen on random halves of the kernel sets of shared/data/argonne-offline (vLLM 0.6.1, tp 1-8 on
# H100, A100, MI300X, MI250) among 0.5, 1 and 1.5 ms; see fit.py's notes on how halves are scored.
T_TP_V0 = 5e-4


def default_params(gpu: GPU, engine: str = "vllm", engine_version: str = "") -> StepParams:
    """Measurement-free defaults per GPU family and engine, for unanchored ranking only.

    Why these numbers: decode GEMV kernels reach 75-85% of HBM peak on H100/B200 and somewhat
    less on MI300-class parts with today's kernels; graph-captured host overhead per step is a
    few ms for vLLM and somewhat lower for SGLang's overlap scheduler."""
    amd = gpu.vendor == "amd"
    host = {"vllm": 4e-3, "sglang": 3e-3, "atom": 3.5e-3}.get(engine, 4e-3)
    # Separate prefill batches hand out a whole batch's first tokens together (wave share near
    # 1); mixed chunked steps emit them chunk by chunk as the wave spreads (near 1/4).
    burst = 0.9 if engine == "sglang" else 0.5
    # Per-request latency outside the engine steps (HTTP, tokenizer process, IPC to the
    # scheduler, first chunk out). Where one anchor pins it, SGLang's fits land at 0.1-0.3 s and
    # vLLM's at 0.03-0.1 s on the dev data (shared/data/aic-silicon); the defaults sit inside.
    # vLLM's API-server share now sits in t_front (below); 0.03 s chosen among 0.02-0.06 s with
    # `inferasim validate` (vLLM TTFT 13.5% at 0.045 s, 13.1-13.3% at 0.025-0.035 s).
    t_ttft = 0.15 if engine == "sglang" else 0.03
    # vLLM's serial per-prompt-token front-end cost (see StepParams.t_front_token): 1 us per token
    # was chosen among 0.5-3 us with `inferasim validate` (vLLM TTFT 14.8% -> 14.5%). SGLang's
    # per-request t_front already takes its front end, and every per-token value made it worse
    # (0.5-2 us tried); ATOM has no data here, so it keeps none.
    t_front_token = 1e-6 if engine == "vllm" else 0.0
    # vLLM's API server also spends a fixed time per request in its one process (request parsing
    # and validation, output-stream set-up) before the engine core sees it. On shared/data/aic-
    # silicon, MiniMax-M2.5 (B200, fp8, tp2) adds 2.0 ms of TTFT per client at 1024-token prompts
    # and 10.4 ms at 8192: 1.2 us per token and 0.8 ms per request at a wave share of about 0.45,
    # near 2 ms per request. 2 ms chosen among 1-4 ms (vLLM TTFT 13.8% -> 13.5%). SGLang's fits
    # find their own (its prior stays at the floor: every default tried made it worse).
    t_front = 2e-3 if engine == "vllm" else 0.0
    # Prefill attention (e_attn): a 1024-token anchor hardly constrains it, so the default carries
    # 8192-token prompts. With block-scaled FP8 at the BF16 rate (BLOCK_FP8_RATE), `inferasim
    # validate` is flat from 0.4 to 0.7 on NVIDIA (TTFT 13.3-13.4%) and worse at 0.3 (14.2%); 0.40 kept.
    # Host time per running sequence per step. vLLM's V0 engine prepares inputs, samples, detokenises
    # and builds outputs per sequence in Python on the step's critical path (what the V1 rewrite moved
    # off it; vLLM blog, "vLLM V1", 2025-01-27). Its cost shows as the part of the per-sequence slope
    # of batch latency that tp does not divide: across the V0.6.1 offline rows of shared/data/argonne-
    # offline, 16 -> 64 prompts over tp 1-8, 0.07-0.14 ms per sequence per step on H100, A100, MI300X
    # and MI250 alike (Llama-2-7B, Llama-3-8B, Mistral-7B, Qwen2-7B, Mixtral, Llama-2-70B).
    v0 = engine == "vllm" and vllm_v0(engine_version, gpu.vendor)
    t_seq = T_SEQ_V0 if v0 else 2e-5
    return StepParams(
        t_fixed=host,
        t_seq=t_seq,
        t_tp=T_TP_V0 if v0 else 0.0,
        t_hop=max(allreduce_hop_latency(engine, engine_version, gpu.name, gpu.vendor) - gpu.scale_up.latency, 0.0),
        burst=burst,
        t_ttft=t_ttft,
        t_front_token=t_front_token,
        t_front=t_front,
        e_bw=0.70 if amd else 0.80,
        e_kv=0.45 if amd else 0.55,
        e_flops=0.45 if amd else 0.55,
        e_attn=0.35 if amd else 0.40,
    )


# ------------------------------------------------------------------------------------------------
# The step
# ------------------------------------------------------------------------------------------------

def gemm_shape(m: ArrayLike, n: float) -> ArrayLike:
    """Share of the large-GEMM efficiency a GEMM of `m` rows by `n` columns per GPU reaches."""
    return 1.0 / (1.0 + GEMM_M0 / np.maximum(np.asarray(m, dtype=float), 1.0) + GEMM_N0 / n)


def busiest_rank_factor(tokens_routed: ArrayLike, ranks: int, skew: float) -> ArrayLike:
    """Load of the busiest of `ranks` expert ranks relative to the mean.

    Uniform routing of N token-expert pairs over r ranks is multinomial: the maximum exceeds the
    mean N/r by about sqrt(2 ln r x N/r). Real routers are skewed: `skew` adds a relative excess
    that grows with log(r) (measured at the anchor's ep, re-evaluated at the target's)."""
    if ranks <= 1:
        return np.ones_like(np.asarray(tokens_routed, dtype=float))
    mean = np.maximum(np.asarray(tokens_routed, dtype=float) / ranks, 1e-9)
    statistical = np.sqrt(2.0 * math.log(ranks) / mean)
    return 1.0 + np.minimum(statistical, ranks - 1.0) + skew * math.log2(ranks) / 3.0


def micro_batches(n_dec: ArrayLike, pp: int) -> ArrayLike:
    """Pipeline micro-batches in flight for `n_dec` running sequences: min(pp, sequences), at
    least one (see step_time). Plain Python for a scalar: the simulator asks once per step."""
    if pp <= 1:
        return 1.0
    if isinstance(n_dec, int | float):
        return min(max(float(n_dec), 1.0), float(pp))
    return np.clip(n_dec, 1.0, pp)


def step_time(p: StepParams, c: LayoutCost, n_dec: ArrayLike, ctx_dec: ArrayLike,
              n_pref: ArrayLike = 0.0, ctx_pref: ArrayLike = 0.0, seq_pref: ArrayLike | None = None) -> ArrayLike:
    """Seconds of one iteration on one attention-dp rank of one replica (all pp stages: the
    latency a decode token sees). `n_dec`, `n_pref` are per dp rank; `seq_pref`, where known, is
    the longest sequence (cached prefix included) among the step's prefills, which decides a DSA
    model's dense-or-sparse prefill (LayoutCost.sparse_prefill)."""
    n_dec = np.asarray(n_dec, dtype=float)
    n_pref = np.asarray(n_pref, dtype=float)
    lay = c.layout
    # Pipeline stages keep micro-batches in flight (vLLM V1 schedules up to pp batches at once,
    # SGLang its pp micro-batches): the running sequences split into m = min(pp, sequences)
    # micro-batches, each passes every stage, and a sequence's step is one micro-batch's pass,
    # pp stage-times of its share. Weights are read once per micro-batch per stage; the KV and the
    # token-proportional work of the batch spread over the stages working at once. A lone request
    # (m = 1) runs the stages one after another, as without pipelining.
    m = micro_batches(n_dec, lay.pp)
    tokens = (n_dec + n_pref) / m  # per micro-batch
    bw_w = c.peak_bw * p.e_bw
    host = p.host_time(n_dec, lay.tp)
    # Weight passes of a kernel that tiles M in m_tile rows (StepParams.m_tile): one pass for the
    # first tile, one more per tile after it; the passes run over the tiles in parallel, so the
    # step is bound by the slowest of one pass from HBM, the FLOPs, and the passes of all tiles.
    tiles = tokens / p.m_tile
    t_dense = roof(c.dense_bytes / bw_w, roof(c.dense_flops_per_token * tokens /
                   (c.gemm_flops_dense * p.e_flops * gemm_shape(tokens, c.dense_width)),
                   c.dense_bytes * tiles / bw_w))
    t_moe = 0.0
    if c.n_experts:
        # Tokens of all dp ranks meet in each MoE layer.
        routed = tokens * lay.dp * c.top_k
        distinct = c.n_experts * (1.0 - np.power(1.0 - c.top_k / c.n_experts, tokens * lay.dp))
        factor = busiest_rank_factor(routed, lay.moe_ep, p.moe_skew)
        experts_here = np.minimum(distinct / lay.moe_ep * np.minimum(factor, 2.0), c.n_experts / lay.moe_ep)
        tok_here = routed / lay.moe_ep * factor
        per_expert = tok_here / np.maximum(experts_here, 1e-9)
        t_moe = roof(experts_here * c.expert_bytes / bw_w,
                     roof(tok_here * c.expert_flops_per_token /
                          (c.gemm_flops_moe * p.e_flops * gemm_shape(per_expert, c.expert_width)),
                          experts_here * c.expert_bytes * (per_expert / p.m_tile) / bw_w))
    t_attn = (n_dec * c.kv_read_bytes(ctx_dec) / (c.peak_bw * p.e_kv) +
              n_pref * c.prefill_attn_flops(ctx_pref, seq_pref) / (c.peak_flops_attn * p.e_attn)) / m
    if c.dsa_topk:
        t_attn = t_attn + n_pref * c.sparse_prefill_time(ctx_pref, seq_pref) / m
    t_comm = p.comm_scale * c.comm_time(tokens) + p.t_hop * c.allreduce_hops
    gpu_part = (t_dense + t_moe + t_attn + t_comm) * lay.pp
    if lay.pp > 1:
        # One activation hop per stage boundary.
        hop = c.gpu.scale_up.latency + tokens * c.hidden * c.act_bytes / c.gpu.scale_up.bandwidth
        gpu_part = gpu_part + (lay.pp - 1) * hop
    return host + gpu_part


def gpu_part_time(p: StepParams, c: LayoutCost, n_dec: ArrayLike, ctx_dec: ArrayLike,
                  n_pref: ArrayLike = 0.0, ctx_pref: ArrayLike = 0.0) -> ArrayLike:
    """The GPU-divisible part of the step (the step minus the host part)."""
    return step_time(p, c, n_dec, ctx_dec, n_pref, ctx_pref) - p.host_time(n_dec, c.layout.tp)


def roofline_floor(c: LayoutCost, n_dec: ArrayLike, ctx_dec: ArrayLike, n_pref: ArrayLike = 0.0,
                   ctx_pref: ArrayLike = 0.0) -> ArrayLike:
    """The fastest the step could physically be: weights and decode KV at full HBM bandwidth or
    dense GEMMs at peak FLOP/s, whichever is slower; no host cost, no collectives, no experts.
    Under pipeline stages, per micro-batch pass as step_time splits it (every stage reads its
    weights for each micro-batch, and the batch's KV and FLOPs spread over the stages)."""
    n_dec = np.asarray(n_dec, dtype=float)
    m = micro_batches(n_dec, c.layout.pp)
    tokens = (n_dec + np.asarray(n_pref, dtype=float)) / m
    mem = c.dense_bytes / c.peak_bw + n_dec / m * c.kv_read_bytes(ctx_dec) / c.peak_bw
    comp = c.dense_flops_per_token * tokens / c.peak_flops_dense
    return np.maximum(mem, comp) * c.layout.pp
