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
estimator and the fit stay fast.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from inferasim.catalog.engines import (
    allreduce_hop_latency,
    decode_reads_per_query_head,
    prefill_attention_dtype,
    sparse_mla_kernel,
    vllm_v0,
)
from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import WEIGHT_FORMAT_BYTES, ModelSpec, normalize_precision
from inferasim.layout import Layout
from inferasim.memory import kv_dtype_bytes, weight_bytes_per_gpu

ArrayLike = float | np.ndarray

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
    burst: float = 0.50  # share of wave-mates' prefill a closed-loop request waits for (sim.benchmark)
    t_ttft: float = 0.03  # s per request outside the steps: API server, tokenise, first-token stream
    kv_scale: float = 1.0  # KV pool actually usable / memory-model estimate (KV dtype, preemption)
    # s per request served one at a time by the engine's front end (SGLang's TokenizerManager and
    # scheduler admission, vLLM's API server process): a burst of C arrivals waits k x t_front for
    # its k-th request. Host cost: no layout divides it. Old anchors without it load as 0. Priced by
    # sim.benchmark and transfer.disagg_point; simulated (sim.des, sim.replica) and emulated as one FIFO server.
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
    # anchor's own points (fit.client_cap_of), never a prior; sim.benchmark and sim.des apply it.
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
# other clients on its rank, not its own (sim.benchmark.closed_loop), which moves t_ttft and burst.
# 2026-12-03.3: vLLM's prefill attention at the FP8 rate on Blackwell with an FP8 KV cache
# (catalog.engines.prefill_attention_dtype), which moves e_attn and the prefill share.
# 2026-12-03.4: pipeline stages keep min(pp, sequences) micro-batches in flight (step_time).
# 2026-12-03.5: DeepSeek sparse attention (GLM-5, DeepSeek-V3.2): decode reads the latent of the
# top-k keys only; prefill past the engine's dense limit runs the padded sparse MLA kernel.
# 2026-12-03.6: a DSA layer's cache in its own format (FP8: FlashMLA's 656-byte latent, plus the
# 132-byte FP8 index key in every dtype), which moves e_kv of DSA kernel sets.
# 2026-12-03.7: a mixed-batch wave's persisting share decays with gamma 0.28, not 0.25
# (sim.benchmark.WAVE_GAMMA_MIXED), which moves the burst and t_ttft that vLLM anchors fit.
# 2026-12-04: AMD and vLLM V0 physics (shared/data/argonne-offline): a weight tile (m_tile, fitted
# from a batch sweep), vLLM V0's host time per sequence (T_SEQ_V0) and per tp step (t_tp), RCCL's
# all-reduce latency where vLLM reduced through it (t_hop), the generic ROCm decode kernel's reads
# per query head over MI300X's XCDs (kv_read_amp), and first-run points left out of a fit.
STEP_MODEL_REVISION = "2026-12-04"

# Block-scaled FP8 GEMMs (catalog.models.ModelSpec.fp8_scales: a scale per 128 x 128 weight block,
# applied inside the main loop) run at this multiple of the GPU's BF16 rate, where a per-tensor
# FP8 GEMM gets the full FP8 rate. On shared/data/aic-silicon (min-gpus rule) the prefill time
# that SGLang's TPOT inflation implies at 8192-token prompts is about twice the full-rate
# estimate for every block-FP8 kernel set (Qwen3.5-397B, GLM-5, DeepSeek-R1 at fp8 on B200/B300),
# while the BF16 and NVFP4 ones match it: FP8 at tp4 prefills no faster per token than BF16 at
# tp8. Chosen among 1, 1.25, 1.5 and 2 (the full rate) with `inferasim validate`: against 2, at 1
# TPOT 6.8% -> 6.5%, throughput/GPU 6.6 -> 6.3%, TTFT 14.4 -> 13.4% (SGLang 16.6 -> 14.2%),
# pair accuracy 0.986 -> 0.990 (with the SGLang single-prompt wave share,
# benchmark.SGLANG_SINGLE_PROMPT_WAVE_SHARE); 1.25 and 1.5 (TTFT 14.4%) did no better than 2.
# It holds on every GPU: the one block-FP8 kernel set on H100 (vLLM MiniMax-M2.5) fits TTFT
# 10.3% with it and 11.6% at Hopper's full FP8 rate, although DeepGEMM is reported near 1.5x the
# BF16 peak there. Per-tensor FP8 keeps the full rate: slowing Llama-3.1-70B-FP8 too made vLLM
# TTFT worse. The rate applies where the deployment is FP8; an FP4 deployment's 8-bit layers keep
# the FP8 rate (capping them too gave DeepSeek-R1 fp4 at 8192-token prompts 23% TTFT error instead
# of 17%). Anchors fitted before this rate carry an older fit.step_model and are refitted from
# their points when read (STEP_MODEL_REVISION).
BLOCK_FP8_RATE = 1.0

# Expert-parallel dispatch and combine (all-to-all, or all-gather + reduce-scatter) cost far more
# than a link's raw latency: synchronisation of every rank, token permutation, padding. The
# vLLM DP+EP rows of shared/data/aic-silicon (MiniMax-M2.5, Kimi-K2.5) put it near 60 us per
# collective per MoE layer at 4-16 ranks; the law scales it with log2(ranks).
A2A_LATENCY = 30e-6

# Share of the BF16 peak FlashMLA's sparse prefill kernel reaches on the heads it computes
# (deepseek-ai/FlashMLA README: up to 640 TFLOPS on H800 SXM5, 1450 TFLOPS on B200, both about
# 0.64 of the dense BF16 peak). A fixed figure: an anchor at prompts within the top-k never runs
# the kernel, so no fit can see it. Padded heads count as computed (catalog.engines.sparse_mla_kernel).
SPARSE_MLA_EFFICIENCY = 0.64


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
# Per-layout costs
# ------------------------------------------------------------------------------------------------

def compute_dtype(precision: str, part: str, model: ModelSpec) -> str:
    """Tensor-core dtype a GEMM runs in. Weight-only int4 runs in bf16; fp4 MoE checkpoints keep
    attention at 8/16 bits (see ModelSpec.weight_formats)."""
    fmt = model.weight_formats(precision)[part]
    return {"nvfp4": "fp4", "mxfp4": "fp4", "int4": "bf16", "int8": "int8", "fp8": "fp8",
            "fp16": "fp16"}.get(fmt, "bf16")


def collective_time(nbytes: ArrayLike, ranks: int, gpu: GPU) -> ArrayLike:
    """All-reduce of `nbytes` per rank over `ranks` GPUs.

    Inside the scale-up domain: a latency growing with log2(ranks) plus 2(r-1)/r x bytes over the
    link (ring). Beyond it (multi-node restore), hierarchically: reduce-scatter inside each
    domain, all-reduce of each GPU's 1/g share across the domains over its own NIC, all-gather
    inside the domain; every GPU's NIC works in parallel."""
    nbytes = np.asarray(nbytes, dtype=float)
    if ranks <= 1:
        return np.zeros_like(nbytes)
    g = min(ranks, gpu.scale_up.domain)
    t = 2.0 * gpu.scale_up.latency * math.log2(max(g, 2)) + nbytes * 2.0 * (g - 1) / g / gpu.scale_up.bandwidth
    if ranks > g:
        groups = ranks / g
        t = t + 2.0 * gpu.scale_out.latency * math.log2(groups) + \
            (nbytes / g) * 2.0 * (groups - 1) / groups / gpu.scale_out.bandwidth
    return t


@dataclass(frozen=True)
class LayoutCost:
    """What one GPU of a replica does per step, independent of the batch."""

    model: ModelSpec
    gpu: GPU
    layout: Layout
    precision: str
    kv_dtype: str
    dense_bytes: float  # weights read once per step (attention, dense MLP, shared experts, head)
    dense_flops_per_token: float
    expert_bytes: float  # one routed expert's slice on a GPU, summed over MoE layers
    expert_flops_per_token: float  # per token per expert, summed over MoE layers (GPU slice)
    n_experts: int
    top_k: int
    kv_coeff_full: float  # KV bytes per GPU per token of context, full-attention layers
    kv_windows: tuple[tuple[float, int], ...]  # (bytes per token, window) of windowed layers
    state_bytes: float  # recurrent state per sequence per GPU (linear/Mamba layers)
    attn_flops_coeff: float  # prefill attention FLOPs per GPU per token per token of context
    attn_windows: tuple[tuple[float, int], ...]
    n_layers: int
    moe_layers: int
    hidden: int
    peak_bw: float
    peak_flops_dense: float
    peak_flops_moe: float
    peak_flops_attn: float
    # FLOP/s the step's GEMMs run at before the fitted efficiency: the dtype's peak, except that
    # block-scaled FP8 is held to the BF16 rate (BLOCK_FP8_RATE). The peaks stay for the roofline.
    gemm_flops_dense: float
    gemm_flops_moe: float
    dense_width: float = 1e9  # FLOP-weighted harmonic width per GPU of the dense GEMMs (under tp)
    expert_width: float = 1e9  # output columns per GPU of one routed expert's up GEMM (under moe_tp)
    act_bytes: float = 2.0  # activation element size on the wire
    notes: tuple[str, ...] = field(default_factory=tuple)
    # DeepSeek sparse attention (DSA; catalog.engines.sparse_mla_kernel), zero for other models.
    # Prefill past `dsa_dense_upto` tokens (sparse_prefill says how the length is judged) drops a
    # DSA layer's dense attention (`dsa_dense_coeff` of attn_flops_coeff) for the indexer scoring
    # every earlier token (`dsa_index_flops` per token of context, FP8 math priced at the attention
    # dtype's time) and the sparse MLA kernel over `dsa_topk` keys (`dsa_sparse_flops` per token per key, on the
    # padded heads, at SPARSE_MLA_EFFICIENCY of `peak_flops_sparse`). Decode reads the latent of
    # the top-k keys only (`kv_sparse` bytes per token, at most `dsa_topk` of them) and the index
    # keys of every token (in kv_coeff_full); the cache still holds every token's latent.
    dsa_topk: int = 0
    dsa_dense_upto: int = 0
    dsa_dense_coeff: float = 0.0
    dsa_sparse_flops: float = 0.0
    dsa_index_flops: float = 0.0
    peak_flops_sparse: float = 1.0
    kv_sparse: float = 0.0
    # Decode reads of the full and windowed layers' KV per byte stored: the grouped-query ratio where
    # the engine build's kernel reads the cache once per query head (catalog.engines.
    # decode_reads_per_query_head), else 1.
    kv_read_amp: float = 1.0

    # -- pieces of the step ------------------------------------------------------------------
    def kv_read_bytes(self, ctx: ArrayLike) -> ArrayLike:
        """KV bytes one decode sequence reads at context `ctx` on one GPU."""
        return self._kv_bytes(ctx, self.kv_read_amp)

    def _kv_bytes(self, ctx: ArrayLike, amp: float) -> ArrayLike:
        ctx = np.asarray(ctx, dtype=float)
        out = amp * self.kv_coeff_full * ctx + self.state_bytes
        for coeff, window in self.kv_windows:
            out = out + amp * coeff * np.minimum(ctx, window)
        if self.kv_sparse:
            out = out + self.kv_sparse * np.minimum(ctx, self.dsa_topk)
        return out

    def prefill_attn_flops(self, ctx: ArrayLike, seq: ArrayLike | None = None) -> ArrayLike:
        """Attention FLOPs per prefill token at mean visible context `ctx`, on one GPU (`seq`: the
        batch's longest sequence, see sparse_prefill)."""
        ctx = np.asarray(ctx, dtype=float)
        out = self.attn_flops_coeff * ctx
        for coeff, window in self.attn_windows:
            out = out + coeff * np.minimum(ctx, window)
        if self.dsa_topk:
            extra = (self.dsa_index_flops - self.dsa_dense_coeff) * ctx
            out = out + np.where(self.sparse_prefill(ctx, seq), extra, 0.0)
        return out

    def sparse_prefill(self, ctx: ArrayLike, seq: ArrayLike | None = None) -> ArrayLike:
        """Whether prefill tokens at mean visible context `ctx` take the DSA sparse path. The engine
        decides per batch by its longest sequence, cached prefix included: `seq` where the caller
        knows it (the simulator's batches), else 2 x ctx, exact for a batch of fresh prompts of one
        length (the benchmark's case). From the mean alone, a chunk after a cached prefix of s
        tokens is judged at 2s + n rather than s + n, and a batch mixing one long prompt with many
        short ones may be judged dense where the engine runs it sparse."""
        length = 2.0 * np.asarray(ctx, dtype=float) if seq is None else np.asarray(seq, dtype=float)
        return length > self.dsa_dense_upto

    def sparse_prefill_time(self, ctx: ArrayLike, seq: ArrayLike | None = None) -> ArrayLike:
        """Seconds of the sparse MLA kernel per prefill token at mean visible context `ctx` (0 off
        the sparse path). Every query walks all top-k slots, masked or not, so a prompt shorter
        than k pays for k."""
        if not self.dsa_topk:
            return np.zeros_like(np.asarray(ctx, dtype=float))
        return np.where(self.sparse_prefill(ctx, seq), self.sparse_token_time, 0.0)

    @property
    def sparse_token_time(self) -> float:
        """Seconds of the sparse MLA kernel per prefill token on the sparse path (0 without DSA)."""
        return self.dsa_sparse_flops * self.dsa_topk / (self.peak_flops_sparse * SPARSE_MLA_EFFICIENCY)

    def kv_stored_bytes(self, ctx: ArrayLike) -> ArrayLike:
        """KV bytes one sequence of `ctx` tokens holds on one GPU (what a host reload moves). Equal to
        kv_read_bytes except for DSA layers, which store every token's latent but read k."""
        ctx = np.asarray(ctx, dtype=float)
        return self._kv_bytes(ctx, 1.0) + self.kv_sparse * np.maximum(ctx - self.dsa_topk, 0.0)

    @property
    def allreduce_hops(self) -> float:
        """Latency hops of one step's tensor-parallel all-reduces on one GPU: two all-reduces per
        layer of this stage, each 2 log2(ranks) hops inside the scale-up domain (collective_time)."""
        lay = self.layout
        if lay.tp <= 1:
            return 0.0
        g = min(lay.tp, self.gpu.scale_up.domain)
        return 2.0 * self.n_layers * 2.0 * math.log2(max(g, 2)) / lay.pp

    def comm_time(self, tokens: ArrayLike) -> ArrayLike:
        """Collectives of one step for `tokens` tokens on this dp rank: two all-reduces per layer
        under tp; dispatch + combine of routed tokens when experts span ranks (dp or ep)."""
        tokens = np.asarray(tokens, dtype=float)
        lay = self.layout
        per_layer = np.zeros_like(tokens)
        if lay.tp > 1:
            per_layer = per_layer + 2.0 * collective_time(tokens * self.hidden * self.act_bytes, lay.tp, self.gpu)
        moe_part = np.zeros_like(tokens)
        if self.n_experts and lay.dp > 1:
            # Attention-dp ranks hold different tokens: each MoE layer dispatches top_k copies of
            # every token's hidden state to the expert ranks and combines them back. (With dp = 1
            # every rank already holds all tokens after the tp all-reduce; expert parallelism then
            # costs nothing beyond the all-reduce that tp pays anyway.)
            moved = tokens * self.top_k * self.hidden * self.act_bytes / lay.moe_ep
            moe_part = 2.0 * (collective_time(moved, lay.moe_width, self.gpu)
                              + A2A_LATENCY * math.log2(lay.moe_width))
        return (per_layer * self.n_layers + moe_part * self.moe_layers) / lay.pp


def layout_cost(model: ModelSpec, gpu: GPU, layout: Layout, precision: str = "auto",
                kv_dtype: str = "auto", engine: str = "", engine_version: str = "") -> LayoutCost:
    """Per-GPU work of `layout` (cached: searches ask for the same layouts many times). `engine`
    picks the prefill attention kernels' dtype (catalog.engines.prefill_attention_dtype); without
    one, attention math is priced in BF16."""
    return _layout_cost(model, gpu, layout, precision, kv_dtype, engine,
                        engine_version if decode_reads_per_query_head(engine, engine_version, gpu.vendor) else "")


@functools.lru_cache(maxsize=4096)
def _layout_cost(model: ModelSpec, gpu: GPU, layout: Layout, precision: str, kv_dtype: str,
                 engine: str, engine_version: str = "") -> LayoutCost:
    precision = normalize_precision(precision)
    if precision == "auto":
        precision = {"nvfp4": "fp4"}.get(model.checkpoint_format, model.checkpoint_format)
    per_query_head = decode_reads_per_query_head(engine, engine_version, gpu.vendor)
    amp_num, amp_den = 0.0, 0.0
    w = weight_bytes_per_gpu(model, layout, precision)
    fmts = model.weight_formats(precision)

    act = model.active_params()
    tp, pp = layout.tp, layout.pp
    dense_bytes = w["attention"] + w["dense_mlp"] + w["shared_experts"] + w["other"] + \
        (w["embeddings_head"] / 2 if not model.tie_embeddings else w["embeddings_head"])
    dense_flops = 2.0 * (act.attention + act.dense_mlp + act.shared_experts + act.head) / tp / pp
    moe_layers = [la for la in model.layers if la.mlp.kind == "moe"]
    expert_params = sum(la.mlp.expert_params for la in moe_layers)
    expert_bytes = expert_params * WEIGHT_FORMAT_BYTES[fmts["routed_experts"]] / layout.moe_tp / pp
    expert_flops = 2.0 * expert_params / layout.moe_tp / pp
    kvb = kv_dtype_bytes(kv_dtype)
    kv_full = 0.0
    kv_win: dict[int, float] = {}
    attn_full = 0.0
    attn_win: dict[int, float] = {}
    state = 0.0
    pad_heads, dense_upto = sparse_mla_kernel(engine, gpu.vendor, "fp8" in gpu.flops, "fp4" in gpu.flops,
                                              model.dsa_topk)
    dsa_dense, dsa_sparse, dsa_index, kv_sparse = 0.0, 0.0, 0.0, 0.0
    for la in model.layers:
        a = la.attention
        heads_here = a.n_heads / tp if a.n_heads >= tp else min(a.n_heads, 1)
        if a.kind in ("linear", "mamba"):
            state += a.state_elems * 4.0 / tp
            continue
        if a.n_heads == 0:
            continue
        if a.kind == "mla":
            kv = a.kv_bytes(kvb)  # latent replicated on every tp rank
            fl = 2.0 * heads_here * (a.qk_head_dim + a.v_head_dim)
            if a.index_topk:
                if a.window:  # the dense part subtracted below is the full-attention coefficient
                    raise ValueError(f"{model.name}: a sparse-attention layer with a sliding window is not priced")
                # Absorbed form: scores over latent + rope, values over the latent, per padded head.
                padded = pad_heads * math.ceil(heads_here / pad_heads)
                dsa_sparse += 2.0 * padded * (2 * a.kv_lora_rank + a.qk_rope_head_dim)
                # The indexer is replicated on every tp rank (vLLM and SGLang: "no tensor
                # parallel, just replicated"); FP8 logits.
                dsa_index += 2.0 * a.index_heads * a.index_head_dim
                dsa_dense += fl
                # Decode reads the latent for the top-k keys only (kv_sparse), the index key for all.
                kv_sparse += a.latent_bytes(kvb)
                kv = a.index_key_bytes()
        else:
            kv_heads_here = max(a.n_kv_heads / tp, 1.0) if a.n_kv_heads else 0.0
            kv = kv_heads_here * (a.qk_head_dim + a.v_head_dim) * kvb
            if per_query_head and kv_heads_here:
                # catalog.engines.decode_reads_per_query_head: each query head's block reads its KV
                # head. The blocks of one KV head share an L2 on a single-die GPU (MI250's GCD: the
                # cache takes the repeats), but on a part that spreads them over its dies' private
                # L2s (GPU.l2_domains: MI300X's 8 XCDs) up to that many fetch it from memory.
                amp_num += kv * min(max(heads_here / kv_heads_here, 1.0), gpu.l2_domains)
                amp_den += kv
            fl = 2.0 * heads_here * (a.qk_head_dim + a.v_head_dim)
        if a.window:
            kv_win[a.window] = kv_win.get(a.window, 0.0) + kv
            attn_win[a.window] = attn_win.get(a.window, 0.0) + fl
        else:
            kv_full += kv
            attn_full += fl
    dense_dtype = compute_dtype(precision, "attention", model)
    moe_dtype = compute_dtype(precision, "routed_experts", model)
    n_moe = max(la.mlp.n_experts for la in model.layers)
    top_k = max(la.mlp.top_k for la in model.layers)
    # GEMM widths per GPU for the shape factor. The dense GEMMs of a step (attention projections,
    # dense FFNs, shared experts) get one FLOP-weighted harmonic width sum(F) / sum(F / N), exact
    # for the factor's 1/N form; attention's width is its projections' columns, about
    # params / (2 x hidden), under tp.
    hidden = max(model.hidden_size, 1)
    flops, over_width = 0.0, 0.0
    for la in model.layers:
        parts = [(la.attention.params, la.attention.params / (2.0 * hidden)),
                 (la.mlp.dense_params, la.mlp.dense_width),
                 (la.mlp.shared_params, la.mlp.shared_width)]
        for weights, width in parts:
            if weights > 0 and width > 0:
                flops += weights
                over_width += weights / (width / tp)
    dense_width = flops / over_width if over_width else 1e9
    expert_width = max((la.mlp.expert_width for la in moe_layers), default=0) / layout.moe_tp or 1e9
    peak_dense, peak_moe = gpu.peak_flops(dense_dtype), gpu.peak_flops(moe_dtype)
    block_fp8 = precision == "fp8" and model.fp8_scales == "block"

    def gemm_rate(dtype: str, peak: float) -> float:
        return min(peak, BLOCK_FP8_RATE * gpu.peak_flops("bf16")) if block_fp8 and dtype == "fp8" else peak

    attn_dtype = prefill_attention_dtype(engine, gpu.vendor, "fp4" in gpu.flops, kv_dtype, model.uses_mla)
    fp8_speedup = gpu.peak_flops("fp8") / gpu.peak_flops(attn_dtype)
    return LayoutCost(
        model=model, gpu=gpu, layout=layout, precision=precision, kv_dtype=kv_dtype,
        dense_bytes=dense_bytes, dense_flops_per_token=dense_flops,
        expert_bytes=expert_bytes, expert_flops_per_token=expert_flops,
        n_experts=n_moe, top_k=top_k,
        kv_read_amp=amp_num / amp_den if amp_den else 1.0,
        kv_coeff_full=kv_full / pp, kv_windows=tuple((c / pp, w_) for w_, c in kv_win.items()),
        state_bytes=state / pp, attn_flops_coeff=attn_full / pp,
        attn_windows=tuple((c / pp, w_) for w_, c in attn_win.items()),
        n_layers=model.num_layers, moe_layers=model.moe_layers, hidden=model.hidden_size, peak_bw=gpu.hbm_bandwidth,
        dense_width=max(dense_width, 1.0), expert_width=max(expert_width, 1.0),
        peak_flops_dense=peak_dense, peak_flops_moe=peak_moe, peak_flops_attn=gpu.peak_flops(attn_dtype),
        gemm_flops_dense=gemm_rate(dense_dtype, peak_dense), gemm_flops_moe=gemm_rate(moe_dtype, peak_moe),
        dsa_topk=model.dsa_topk, dsa_dense_upto=dense_upto, dsa_dense_coeff=dsa_dense / pp,
        dsa_sparse_flops=dsa_sparse / pp, dsa_index_flops=dsa_index / fp8_speedup / pp,
        peak_flops_sparse=gpu.peak_flops("bf16"), kv_sparse=kv_sparse / pp,
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
