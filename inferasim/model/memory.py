"""Memory feasibility: weights per GPU, workspace, and the KV capacity the engine would have.

The KV capacity follows each engine's own rule (shared/notes/engine-facts.md section 5.4):
- vLLM V1 and ATOM: `gpu_memory_utilization x HBM - weights - peak activations - non-torch`;
- SGLang: `mem_fraction_static x HBM` holds weights and the KV pool together, so the KV pool is
  what is left of that fraction after the weights.
Activation and runtime overheads are estimates (the engines measure them in a profiling run at
start-up); they are stated in the plan so an operator can see what was assumed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from inferasim.catalog.engines import engine_defaults, normalize_engine
from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import ModelSpec
from inferasim.catalog.precision import normalize_precision
from inferasim.core.layout import Layout

# Runtime memory outside PyTorch's allocator and CUDA/HIP graphs: CUDA context, NCCL/RCCL
# buffers, graph pools. vLLM's profiler measures it; 2.5 GB is a typical figure on an 8-GPU node.
NON_TORCH_BYTES = 2.5e9

HYBRID_STATE_SEQS = 256

KV_DTYPE_BYTES: dict[str, float] = {"auto": 2.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0,
                                    "fp8_e5m2": 1.0, "nvfp4": 0.5625}


def kv_dtype_bytes(kv_dtype: str) -> float:
    key = (kv_dtype or "auto").lower()
    if key not in KV_DTYPE_BYTES:
        raise ValueError(f"unknown kv_cache_dtype {kv_dtype!r}; accepted: {', '.join(KV_DTYPE_BYTES)}")
    return KV_DTYPE_BYTES[key]


def weight_bytes_per_gpu(model: ModelSpec, layout: Layout, precision: str = "auto") -> dict[str, float]:
    """Weights held by the busiest GPU of the layout, by kind.

    Attention, dense MLP and shared experts are split over tp (replicated over attention dp);
    routed experts over moe_tp x moe_ep; layers over pp stages (the first stage also holds the
    embedding, the last the LM head; vocab-parallel over tp)."""
    wb = model.weight_bytes(precision)
    pp = layout.pp
    out = {
        "attention": wb["attention"] / layout.tp / pp,
        "dense_mlp": wb["dense_mlp"] / layout.tp / pp,
        "shared_experts": wb["shared_experts"] / layout.tp / pp,
        "routed_experts": wb["routed_experts"] / layout.moe_width / pp,
        # With pp > 1 embedding and head sit on different stages: the busiest holds one of them.
        "embeddings_head": (wb["embeddings"] + wb["head"]) / layout.tp / (2 if pp > 1 else 1),
        "other": wb["other"] / pp,
    }
    out["total"] = sum(out.values())
    return out


def kv_bytes_per_token_per_gpu(model: ModelSpec, layout: Layout, kv_dtype: str = "auto", engine: str = "") -> float:
    """KV bytes one token of one sequence costs on each GPU that holds that sequence, as the
    engine sizes its pool.

    GQA KV heads split over tp down to one head per GPU and replicate beyond; MLA's latent is
    shared by all heads, so every tp rank stores all of it. Layers split over pp. A DSA layer's
    cache is priced in its own format (AttentionSpec.kv_bytes), except that SGLang sizes its pool
    with the latent at (kv_lora + rope) x the dtype (get_cell_size_per_token) although its FP8 cells
    are FlashMLA's 656-byte fp8_ds_mla: its pool holds as many tokens as that count gives. On
    shared/data/aic-silicon GLM-5 fp8 on 8 B200 runs 128 clients of 9216 tokens without the
    queue the true cell size would give."""
    dtype = kv_dtype_bytes(kv_dtype)
    total = 0.0
    for layer in model.layers:
        a = layer.attention
        if not a.kv_elems_per_token:
            continue
        if a.kind == "mla":
            total += a.kv_bytes(dtype, ds_mla=engine != "sglang")
        else:
            heads_per_gpu = math.ceil(a.n_kv_heads / layout.tp) if a.n_kv_heads >= layout.tp else 1
            total += a.kv_bytes(dtype) * heads_per_gpu / a.n_kv_heads
    return total / layout.pp


@dataclass
class MemoryPlan:
    model: str
    gpu: str
    engine: str
    precision: str
    layout: Layout
    hbm_bytes: float
    memory_fraction: float
    weights: dict[str, float]
    activation_bytes: float
    non_torch_bytes: float
    kv_bytes: float  # KV pool per GPU
    kv_bytes_per_token: float  # per GPU, per token of one sequence
    kv_tokens: int  # tokens the KV pool holds per attention-dp rank (one engine core)
    state_bytes_per_seq: float
    block_size: int  # the engine's KV block (catalog.engines defaults), in tokens
    feasible: bool
    reasons: list[str] = field(default_factory=list)

    @property
    def kv_tokens_per_replica(self) -> int:
        return self.kv_tokens * self.layout.dp

    def start_max_model_len(self, model_context: int) -> int | None:
        """The --max-model-len vLLM needs to start, where its KV pool cannot hold one sequence of
        the model's whole context: vLLM V1 refuses a max_model_len longer than its KV cache stores
        (v1/core/kv_cache_utils.py check_enough_kv_cache_memory), so it is given, in whole KV
        blocks. None where the context fits, or for SGLang and ATOM (SGLang caps a request's
        input at its pool itself)."""
        if self.engine != "vllm" or model_context <= 0 or self.kv_tokens >= model_context:
            return None
        return max(self.kv_tokens // self.block_size * self.block_size, 0)

    def max_concurrency(self, context: int) -> int:
        """Sequences of `context` tokens that fit at once in one replica."""
        if context <= 0:
            raise ValueError("context must be positive")
        return (self.kv_tokens // context) * self.layout.dp

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "gpu": self.gpu,
            "engine": self.engine,
            "precision": self.precision,
            "layout": self.layout.as_dict(),
            "gpus": self.layout.gpus,
            "hbm_gb": self.hbm_bytes / 1e9,
            "memory_fraction": self.memory_fraction,
            "weights_gb_per_gpu": {k: v / 1e9 for k, v in self.weights.items()},
            "activation_gb": self.activation_bytes / 1e9,
            "non_torch_gb": self.non_torch_bytes / 1e9,
            "kv_gb_per_gpu": self.kv_bytes / 1e9,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token,
            "kv_tokens_per_dp_rank": self.kv_tokens,
            "kv_tokens_per_replica": self.kv_tokens_per_replica,
            "state_bytes_per_seq": self.state_bytes_per_seq,
            "feasible": self.feasible,
            "reasons": self.reasons,
        }


def activation_bytes(model: ModelSpec, layout: Layout, max_batched_tokens: int, max_num_seqs: int) -> float:
    """Peak activations of the engine's profiling run: the largest token batch through one
    layer (hidden states, the widest FFN slice, attention scratch) plus sampler logits in fp32."""
    widest = 0.0
    for layer in model.layers:
        mlp = layer.mlp
        ffn = mlp.dense_params / (3 * model.hidden_size) / layout.tp if mlp.dense_params else 0.0
        if mlp.kind == "moe":
            ffn = max(ffn, mlp.top_k * mlp.expert_params / (3 * model.hidden_size) / layout.moe_tp)
        widest = max(widest, ffn)
    per_token = 2.0 * (6 * model.hidden_size + 3 * widest)
    logits = max_num_seqs * model.vocab_size / layout.tp * 4.0
    return max_batched_tokens * per_token + logits


def layout_problems(model: ModelSpec, layout: Layout, engine: str) -> list[str]:
    """Why the engine would refuse `layout` at start-up, whatever the memory (empty if it would not)."""
    reasons: list[str] = []
    if model.n_experts and layout.moe_ep > model.n_experts:
        reasons.append(f"moe_ep={layout.moe_ep} exceeds the model's {model.n_experts} experts")
    if not model.n_experts and layout.moe_ep > 1:
        reasons.append(f"moe_ep={layout.moe_ep} on a dense model: {model.name} has no experts to spread (drop --ep)")
    heads = model.attention_heads
    # vLLM and ATOM assert at start-up that tp divides the attention heads, and so does SGLang, per
    # attention-tp group (LlamaAttention, Qwen2Attention: total_num_heads % tp_size == 0; MLA's
    # DeepseekV2AttentionMLA: num_heads % attn_tp_size == 0, attn_tp = tp / dp under DP attention).
    # SGLang pads heads only on CPU (sgl-project/sglang PR #6771). Our tp is the attention tp.
    if heads % layout.tp:
        hint = " (SGLang runs such widths with DP attention: --enable-dp-attention, our dp)" \
            if normalize_engine(engine) == "sglang" and model.uses_mla else ""
        reasons.append(f"tp={layout.tp} does not divide the {heads} attention heads{hint}")
    kv = model.kv_heads
    if not model.uses_mla and kv > 1 and (layout.tp % kv if layout.tp >= kv else kv % layout.tp):
        # QKV projections split KV heads over tp, or replicate each over tp / kv ranks.
        reasons.append(f"tp={layout.tp} neither divides nor is a multiple of the {kv} KV heads")
    if layout.pp > model.num_layers:
        reasons.append(f"pp={layout.pp} exceeds the model's {model.num_layers} layers")
    return reasons


def plan_memory(model: ModelSpec, gpu: GPU, layout: Layout, engine: str = "vllm",
                precision: str = "auto", kv_dtype: str = "auto",
                memory_fraction: float | None = None, max_num_batched_tokens: int | None = None,
                max_num_seqs: int | None = None) -> MemoryPlan:
    """Memory of one GPU of one replica, and the KV capacity the engine would report."""
    engine = normalize_engine(engine)
    precision = normalize_precision(precision)
    # SGLang's --tp-size spans all attention-dp ranks (our tp x dp GPUs per stage).
    engine_tp = layout.tp * layout.dp if engine == "sglang" else layout.tp
    defaults = engine_defaults(engine, gpu.hbm_bytes, tp=engine_tp, pp=layout.pp,
                               dp_attention=layout.dp, gpu_name=gpu.name)
    frac = defaults.memory_fraction if memory_fraction is None else memory_fraction
    if not 0.0 < frac <= 1.0:
        if memory_fraction is not None:
            raise ValueError(f"memory fraction {frac} must be in (0, 1]")
        # SGLang's reserve for CUDA graphs grows with cuda_graph_max_bs x DP-attention ranks: at
        # wide DP attention its own formula leaves nothing, and the server needs the flags by hand.
        raise ValueError(
            f"{engine}'s default memory fraction comes out at {frac} for {layout.label()} on {gpu.name} "
            f"(its CUDA-graph reserve grows with the {layout.dp} attention-dp ranks): the engine would not start "
            "this way; give the memory fraction (--memory-fraction; SGLang --mem-fraction-static, with a smaller "
            "--cuda-graph-max-bs) or fewer attention-dp ranks")
    mbt = max_num_batched_tokens or defaults.max_num_batched_tokens
    mns = max_num_seqs or defaults.max_num_seqs
    reasons = layout_problems(model, layout, engine)
    weights = weight_bytes_per_gpu(model, layout, precision)
    act = activation_bytes(model, layout, mbt, mns)
    budget = frac * gpu.hbm_bytes
    if defaults.memory_rule == "sglang":
        # mem_fraction_static covers weights + KV pool; activations live in the reserved rest.
        kv_bytes = budget - weights["total"]
    else:
        kv_bytes = budget - weights["total"] - act - NON_TORCH_BYTES
    per_token = kv_bytes_per_token_per_gpu(model, layout, kv_dtype, engine)
    state = model.state_bytes_per_seq() / layout.tp / layout.pp
    if weights["total"] > budget:
        reasons.append(
            f"weights need {weights['total'] / 1e9:.1f} GB per GPU at {layout.label()}, "
            f"{gpu.name} has {gpu.hbm_bytes / 1e9:.1f} GB ({gpu.hbm_gb:.0f} GiB), of which {engine} gives "
            f"{budget / 1e9:.1f} GB (memory fraction {frac:.3f})"
        )
    elif kv_bytes <= 0:
        reasons.append(
            f"no room for KV cache: weights {weights['total'] / 1e9:.1f} GB + activations "
            f"{act / 1e9:.1f} GB exceed {budget / 1e9:.1f} GB on {gpu.name}"
        )
    # Hybrid models reserve recurrent state per running sequence out of the same pool; engines
    # size that pool for far fewer sequences than their max_num_seqs default (SGLang's
    # max_mamba_cache_size, vLLM's hybrid allocator), so at most HYBRID_STATE_SEQS are reserved.
    kv_for_tokens = max(kv_bytes - state * min(mns, HYBRID_STATE_SEQS), 0.0) if state else max(kv_bytes, 0.0)
    tokens = int(kv_for_tokens // per_token) if per_token > 0 else 0
    if not reasons and tokens < 1:
        reasons.append("KV pool holds no token")
    return MemoryPlan(
        model=model.name, gpu=gpu.name, engine=engine, precision=precision, layout=layout,
        hbm_bytes=gpu.hbm_bytes, memory_fraction=frac, weights=weights, activation_bytes=act,
        non_torch_bytes=0.0 if defaults.memory_rule == "sglang" else NON_TORCH_BYTES,
        kv_bytes=max(kv_bytes, 0.0), kv_bytes_per_token=per_token, kv_tokens=tokens,
        state_bytes_per_seq=state, block_size=max(defaults.block_size, 1), feasible=not reasons, reasons=reasons,
    )


def start_max_model_len(model: ModelSpec, gpu: GPU, layout: Layout, engine: str, precision: str = "auto",
                        kv_dtype: str = "auto", memory_fraction: float | None = None,
                        max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None) -> int | None:
    """The --max-model-len a rendered deployment must carry for the engine to start (None: the
    model's context fits its KV pool; see MemoryPlan.start_max_model_len)."""
    plan = plan_memory(model, gpu, layout, engine=engine, precision=precision, kv_dtype=kv_dtype,
                       memory_fraction=memory_fraction, max_num_batched_tokens=max_num_batched_tokens,
                       max_num_seqs=max_num_seqs)
    return plan.start_max_model_len(model.max_context)
