"""What one GPU of a replica does per engine step, whatever the batch: `LayoutCost`.

Weight bytes and FLOPs per token of the dense part and of one routed expert, KV bytes per token of
context as the decode kernels read and as the cache stores them, prefill attention FLOPs, DeepSeek
sparse attention, and the tensor-parallel collectives, for one (model, GPU, layout, precision, KV
dtype, engine build). `inferasim.model.steptime.step_time` prices a batch with them and the fitted
efficiencies of a kernel set.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from inferasim.catalog.engines import decode_reads_per_query_head, prefill_attention_dtype, sparse_mla_kernel
from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import WEIGHT_FORMAT_BYTES, ModelSpec
from inferasim.catalog.precision import WEIGHT_FORMATS, normalize_precision
from inferasim.core.layout import Layout
from inferasim.model.memory import kv_dtype_bytes, weight_bytes_per_gpu

ArrayLike = float | np.ndarray

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

# Expert-parallel dispatch and combine under attention dp (LayoutCost.moe_exchange) cost far more
# than a link's raw latency: synchronisation of every rank, token permutation, padding. A fixed
# cost per exchange, as DeepEP's low-latency kernels have (each rank writes to all its
# destinations at once; the time grows with the bytes, not with a ring's hops). It was sized at
# 30 us x log2(ranks) on vLLM rows of shared/data/aic-silicon that are now read as tp x ep without
# attention dp (their loader rule, sources.AIC_SILICON_SQUARED_WIDTH), so no aggregated row prices it. The SGLang
# disaggregated decode pools of that file (DeepSeek-R1/V3 at dp 8 on B200, dp 32 on GB200/GB300)
# show it flat: their TPOT at 4-30 sequences per rank is 15-18 ms at dp 32 where 150 us per
# exchange (30 x log2 32) gives 29-31 ms; 30, 45 and 60 us flat did alike on random halves of
# the kernel sets (throughput per GPU 24.0-23.9%), 30 kept.
A2A_LATENCY = 30e-6

# Share of the BF16 peak FlashMLA's sparse prefill kernel reaches on the heads it computes
# (deepseek-ai/FlashMLA README: up to 640 TFLOPS on H800 SXM5, 1450 TFLOPS on B200, both about
# 0.64 of the dense BF16 peak). A fixed figure: an anchor at prompts within the top-k never runs
# the kernel, so no fit can see it. Padded heads count as computed (catalog.engines.sparse_mla_kernel).
SPARSE_MLA_EFFICIENCY = 0.64


# ------------------------------------------------------------------------------------------------
# Per-layout costs
# ------------------------------------------------------------------------------------------------

def compute_dtype(precision: str, part: str, model: ModelSpec) -> str:
    """Tensor-core dtype a GEMM runs in. Weight-only int4 runs in bf16; fp4 MoE checkpoints keep
    attention at 8/16 bits (see ModelSpec.weight_formats)."""
    fmt = WEIGHT_FORMATS.get(model.weight_formats(precision)[part])
    return fmt.compute if fmt is not None else "bf16"


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

    def moe_exchange(self, tokens: ArrayLike) -> ArrayLike:
        """One of the two token exchanges (dispatch, combine) of an MoE layer under attention dp,
        for `tokens` tokens on this dp rank.

        With experts spread over ranks (moe_ep > 1), the all-to-all of SGLang's DeepEP (--moe-a2a-
        backend deepep) and vLLM's expert-parallel kernels: every rank writes each token's top_k
        copies straight to the ranks holding those experts, all destinations at once, so its time
        is a fixed kernel latency (A2A_LATENCY) plus the bytes this rank sends over its own link,
        and not a ring's latency per hop. With each expert split by moe_tp over every rank
        (moe_ep = 1), SGLang's DP attention gathers all ranks' tokens before the layer and
        scatters them after it (dp_attention.py: dp_gather / dp_scatter, an all-reduce over the
        attention tp group each): a collective of every rank's tokens."""
        lay = self.layout
        if lay.moe_ep > 1:
            link = self.gpu.scale_up if lay.moe_width <= self.gpu.scale_up.domain else self.gpu.scale_out
            sent = tokens * self.top_k * self.hidden * self.act_bytes * (lay.moe_ep - 1) / lay.moe_ep
            return A2A_LATENCY + link.latency + sent / link.bandwidth
        return collective_time(tokens * lay.dp * self.hidden * self.act_bytes, lay.moe_width, self.gpu)

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
            # Attention-dp ranks hold different tokens: each MoE layer moves them to the expert
            # ranks and back (moe_exchange, twice). (With dp = 1 every rank already holds all
            # tokens after the tp all-reduce; expert parallelism then costs nothing beyond the
            # all-reduce that tp pays anyway.)
            moe_part = 2.0 * self.moe_exchange(tokens)
        return (per_layer * self.n_layers + moe_part * self.moe_layers) / lay.pp


def layout_cost(model: ModelSpec, gpu: GPU, layout: Layout, precision: str = "auto",
                kv_dtype: str = "auto", engine: str = "", engine_version: str = "") -> LayoutCost:
    """Per-GPU work of `layout` (cached: searches ask for the same layouts many times). `engine`
    picks the prefill attention kernels' dtype (catalog.engines.prefill_attention_dtype); without
    one, attention math is priced in BF16."""
    # Cached on what the engine build changes here (its decode kernel's reads), not on the version
    # string: builds that read alike share one entry.
    return _layout_cost(model, gpu, layout, precision, kv_dtype, engine,
                        decode_reads_per_query_head(engine, engine_version, gpu.vendor))


@functools.lru_cache(maxsize=4096)
def _layout_cost(model: ModelSpec, gpu: GPU, layout: Layout, precision: str, kv_dtype: str,
                 engine: str, per_query_head: bool = False) -> LayoutCost:
    precision = normalize_precision(precision)
    if precision == "auto":
        precision = {"nvfp4": "fp4"}.get(model.checkpoint_format, model.checkpoint_format)
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
