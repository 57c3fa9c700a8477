"""Model architectures read from Hugging Face ``config.json`` files.

A :class:`ModelSpec` is a list of :class:`LayerSpec` (attention + MLP per decoder layer) plus
embeddings and head. Everything the performance model needs follows from it, per precision:
parameter counts (total and active), weight bytes split by kind, KV bytes per token, and FLOPs
per token of prefill and decode as functions of context length.

Units: parameters and elements are counts, bytes are bytes, FLOPs are floating-point operations
(one multiply-add = 2 FLOPs). No network access: configs are read from a path, a dict, or the
copies shipped in ``inferasim/catalog/configs/``.

Families understood: dense GQA (Llama 2/3.x, Qwen2/3, Mistral, MiMo), MoE with shared experts and
first-k dense layers (DeepSeek-V3/R1/V3.2, Kimi-K2.x, GLM-5, Qwen3-MoE, Qwen3.5, MiniMax-M2.x/M3,
Mixtral, Llama 4, Step-3.7, MiMo-V2), MLA attention (latent KV), sliding-window / alternating
attention (gpt-oss, Step, MiMo-V2), gated linear attention layers (Qwen3.5) and Mamba-2 layers
(Nemotron-H), which keep a per-sequence state instead of a per-token KV cache.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from inferasim.catalog.precision import PRECISION_ALIASES, WEIGHT_FORMATS, normalize_precision, precision_spec
from inferasim.catalog.userfile import UserFileError, read_user_text
from inferasim.errors import UserError

AttentionKind = Literal["gqa", "mla", "linear", "mamba"]

# Bytes per parameter of each weight format (catalog.precision.WEIGHT_FORMATS, block scales included).
WEIGHT_FORMAT_BYTES: dict[str, float] = {name: f.bytes_per_param for name, f in WEIGHT_FORMATS.items()}



class ModelConfigError(UserError):
    """A config.json that inferasim cannot turn into a ModelSpec; the message names the field."""


class UnknownModelError(UserError):
    """A model name that is neither a known Hugging Face id, an alias, nor a config.json path."""


@dataclass(frozen=True)
class AttentionSpec:
    """One layer's token mixer."""

    kind: AttentionKind
    n_heads: int
    n_kv_heads: int  # GQA KV heads; MLA: 1 (one shared latent); linear/mamba: state heads
    qk_head_dim: int  # per-head dim of q.k (MLA: nope + rope)
    v_head_dim: int
    params: int  # weights of the projections (q, k, v, o, and MLA/linear/mamba specifics)
    window: int | None = None  # sliding window in tokens (None = full attention)
    kv_elems_per_token: int = 0  # KV cache elements per token for this layer (all heads)
    state_elems: int = 0  # fixed per-sequence state (linear attention / Mamba / conv)
    # MLA latent dims; decode runs in the absorbed form over the latent.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    # DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5): a lightning indexer of `index_heads`
    # x `index_head_dim` scores every earlier token, and the MLA attends to the `index_topk` best.
    index_topk: int = 0
    index_heads: int = 0
    index_head_dim: int = 0

    def latent_bytes(self, kv_dtype_bytes: float, ds_mla: bool = True) -> float:
        """Cache bytes of one token's MLA latent (kv_lora + rope). A DSA layer's 8-bit cache is
        FlashMLA's fp8_ds_mla format, which both engines use for it: the latent in FP8 with one FP32
        scale per 128 values, the rope part kept in BF16, 656 B for DeepSeek-V3.2 (FlashMLA README;
        sglang model_runner_kv_cache_mixin.calculate_mla_kv_cache_dim; vllm flashmla_sparse
        get_kv_cache_shape). Plain MLA stores all 576 values in the cache dtype, and so does any
        latent counted with `ds_mla` False (SGLang's pool sizing, memory.kv_bytes_per_token_per_gpu)."""
        if ds_mla and self.index_topk and kv_dtype_bytes == 1.0:
            return self.kv_lora_rank * (1.0 + 4.0 / 128.0) + self.qk_rope_head_dim * 2.0
        return (self.kv_lora_rank + self.qk_rope_head_dim) * kv_dtype_bytes

    def index_key_bytes(self) -> float:
        """Cache bytes of one token's indexer key (DSA): FP8 with one FP32 scale per 128 values,
        whatever the main cache's dtype, 132 B for DeepSeek-V3.2 (sglang NSATokenToKVPool
        index_k_with_scale_buffer; vllm DeepseekV32IndexerCache)."""
        return self.index_head_dim * (1.0 + 4.0 / 128.0) if self.index_topk else 0.0

    def kv_bytes(self, kv_dtype_bytes: float, ds_mla: bool = True) -> float:
        """Cache bytes one token adds to this layer (all heads, before any split over GPUs;
        `ds_mla` as in latent_bytes)."""
        if self.index_topk:
            return self.latent_bytes(kv_dtype_bytes, ds_mla) + self.index_key_bytes()
        return self.kv_elems_per_token * kv_dtype_bytes

    def attn_flops_per_token(self, context: float, phase: Literal["prefill", "decode"]) -> float:
        """FLOPs of score and value mixing for one query token that sees `context` tokens."""
        if self.kind in ("linear", "mamba"):
            # Recurrent state update: O(state) per token, independent of context.
            return 4.0 * self.state_elems
        ctx = min(context, self.window) if self.window else context
        if self.kind == "mla" and phase == "decode":
            # Absorbed MLA: scores over (kv_lora + rope), values over kv_lora, per head.
            return 2.0 * self.n_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim) * ctx
        return 2.0 * self.n_heads * (self.qk_head_dim + self.v_head_dim) * ctx


@dataclass(frozen=True)
class MLPSpec:
    kind: Literal["dense", "moe"]
    dense_params: int = 0  # dense FFN weights (dense layers, or a dense FFN beside MoE)
    n_experts: int = 0
    top_k: int = 0
    expert_params: int = 0  # weights of one routed expert
    shared_params: int = 0  # weights of all shared experts of the layer together
    router_params: int = 0
    # Width (output columns) of each FFN's first GEMM: 2 x intermediate when gated (gate and up
    # fused), 1 x when not. What a GEMM's shape efficiency depends on (steptime.gemm_shape).
    dense_width: int = 0
    expert_width: int = 0
    shared_width: int = 0  # of one shared expert


@dataclass(frozen=True)
class LayerSpec:
    attention: AttentionSpec
    mlp: MLPSpec
    norm_params: int = 0


@dataclass(frozen=True)
class ParamBreakdown:
    attention: float
    dense_mlp: float
    routed_experts: float
    shared_experts: float
    embeddings: float
    head: float
    other: float  # norms, routers

    @property
    def total(self) -> float:
        return (
            self.attention
            + self.dense_mlp
            + self.routed_experts
            + self.shared_experts
            + self.embeddings
            + self.head
            + self.other
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "attention": self.attention,
            "dense_mlp": self.dense_mlp,
            "routed_experts": self.routed_experts,
            "shared_experts": self.shared_experts,
            "embeddings": self.embeddings,
            "head": self.head,
            "other": self.other,
            "total": self.total,
        }


@dataclass(frozen=True, eq=False)  # identity semantics: hashing 100 layer specs per lookup is slow
class ModelSpec:
    name: str  # Hugging Face id, e.g. "meta-llama/Meta-Llama-3.1-70B"
    architecture: str  # config "architectures"[0] or model_type
    model_type: str
    hidden_size: int
    vocab_size: int
    layers: tuple[LayerSpec, ...]
    tie_embeddings: bool
    checkpoint_format: str  # weight format of the published checkpoint: bf16, fp8, nvfp4, mxfp4, int4
    max_context: int
    source: str = ""  # where the config came from
    notes: tuple[str, ...] = field(default_factory=tuple)
    # How the model's weights are scaled when it is served at fp8 (see _fp8_scales): "block" (a
    # scale per 128 x 128 weight block) or "tensor" (per tensor or per output channel).
    fp8_scales: str = "tensor"

    # ---- structure -------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def is_moe(self) -> bool:
        return any(layer.mlp.kind == "moe" for layer in self.layers)

    @property
    def uses_mla(self) -> bool:
        return any(layer.attention.kind == "mla" for layer in self.layers)

    @property
    def dsa_topk(self) -> int:
        """Keys each query of a DeepSeek-sparse-attention layer attends to (0: no DSA layer)."""
        return max((layer.attention.index_topk for layer in self.layers), default=0)

    @property
    def n_experts(self) -> int:
        return max((layer.mlp.n_experts for layer in self.layers), default=0)

    @property
    def top_k(self) -> int:
        return max((layer.mlp.top_k for layer in self.layers), default=0)

    @property
    def moe_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.mlp.kind == "moe")

    @property
    def kv_heads(self) -> int:
        """KV heads of the full-attention GQA layers (1 for MLA), for TP splitting rules."""
        heads = [a.attention.n_kv_heads for a in self.layers if a.attention.kind in ("gqa", "mla")]
        return max(heads) if heads else 1

    @property
    def attention_heads(self) -> int:
        return max(layer.attention.n_heads for layer in self.layers)

    # ---- parameters ------------------------------------------------------------------------
    def params(self) -> ParamBreakdown:
        cached = self.__dict__.get("_params")
        if cached is None:
            cached = self._count_params()
            object.__setattr__(self, "_params", cached)  # frozen: computed once, kept
        return cached

    def _count_params(self) -> ParamBreakdown:
        attn = dense = routed = shared = other = 0.0
        for layer in self.layers:
            attn += layer.attention.params
            dense += layer.mlp.dense_params
            routed += layer.mlp.n_experts * layer.mlp.expert_params
            shared += layer.mlp.shared_params
            other += layer.norm_params + layer.mlp.router_params
        emb = float(self.vocab_size * self.hidden_size)
        head = 0.0 if self.tie_embeddings else emb
        return ParamBreakdown(attn, dense, routed, shared, emb, head, other + self.hidden_size)

    def active_params(self) -> ParamBreakdown:
        """Parameters one token computes with: routed experts count top_k of n_experts, and the
        input embedding table counts zero (a token reads one row of it; OpenAI's gpt-oss model
        card counts active parameters the same way: 5.1B of 116.8B)."""
        p = self.params()
        routed_active = sum(layer.mlp.top_k * layer.mlp.expert_params for layer in self.layers)
        return ParamBreakdown(
            p.attention, p.dense_mlp, routed_active, p.shared_experts, 0.0, p.head, p.other
        )

    @property
    def total_params(self) -> float:
        return self.params().total

    @property
    def active_param_count(self) -> float:
        return self.active_params().total

    # ---- weights by precision ----------------------------------------------------------------
    def weight_formats(self, precision: str = "auto") -> dict[str, str]:
        """Weight format per kind of weight when served at `precision`.

        Why this split: published low-bit checkpoints quantize what dominates the bytes. 4-bit MoE
        checkpoints (gpt-oss MXFP4, Kimi-K2.5 int4, NVIDIA NVFP4 DeepSeek/Kimi/Qwen3.5) keep
        attention, shared experts and dense layers at 8 or 16 bits (their `ignore` /
        `modules_to_not_convert` lists say so); dense 4-bit checkpoints quantize every linear
        layer. Embeddings and the LM head stay in 16 bits throughout.
        """
        p = normalize_precision(precision)
        if p == "auto":
            p = {"nvfp4": "fp4"}.get(self.checkpoint_format, self.checkpoint_format)
        spec = precision_spec(p) if p in PRECISION_ALIASES else None
        if spec is not None and spec.experts_only_in_moe:
            low = spec.weight_format
            if self.is_moe:
                rest = "fp8" if self.checkpoint_format == "fp8" else "bf16"
                return {"attention": rest, "dense_mlp": rest, "routed_experts": low,
                        "shared_experts": rest, "embeddings": "bf16", "head": "bf16", "other": "bf16"}
            return {"attention": low, "dense_mlp": low, "routed_experts": low, "shared_experts": low,
                    "embeddings": "bf16", "head": "bf16", "other": "bf16"}
        return {"attention": p, "dense_mlp": p, "routed_experts": p, "shared_experts": p,
                "embeddings": "bf16", "head": "bf16", "other": "bf16"}

    def weight_bytes(self, precision: str = "auto") -> dict[str, float]:
        """Bytes of each kind of weight and the total, at a serving precision."""
        fmts = self.weight_formats(precision)
        parts = self.params().as_dict()
        out = {k: parts[k] * WEIGHT_FORMAT_BYTES[fmts[k]] for k in fmts}
        out["total"] = sum(out.values())
        return out

    def layer_weight_bytes(self, precision: str = "auto") -> list[dict[str, float]]:
        """Per decoder layer: attention, dense MLP, routed experts (all), shared experts."""
        fmts = self.weight_formats(precision)
        rows = []
        for layer in self.layers:
            rows.append({
                "attention": layer.attention.params * WEIGHT_FORMAT_BYTES[fmts["attention"]],
                "dense_mlp": layer.mlp.dense_params * WEIGHT_FORMAT_BYTES[fmts["dense_mlp"]],
                "routed_experts": layer.mlp.n_experts * layer.mlp.expert_params
                * WEIGHT_FORMAT_BYTES[fmts["routed_experts"]],
                "shared_experts": layer.mlp.shared_params * WEIGHT_FORMAT_BYTES[fmts["shared_experts"]],
            })
        return rows

    def bytes_per_param(self, kind: str, precision: str = "auto") -> float:
        return WEIGHT_FORMAT_BYTES[self.weight_formats(precision)[kind]]

    # ---- KV cache ------------------------------------------------------------------------------
    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2.0, context: float | None = None) -> float:
        """KV bytes one token adds, over all layers. Sliding-window layers stop growing at the
        window, so with `context` given their share is averaged over that context; a DSA layer's
        cache is in its own format (AttentionSpec.kv_bytes)."""
        total = 0.0
        for layer in self.layers:
            a = layer.attention
            if a.kv_elems_per_token == 0:
                continue
            share = a.window / context if a.window and context and context > a.window else 1.0
            total += a.kv_bytes(kv_dtype_bytes) * share
        return total

    def state_bytes_per_seq(self, state_dtype_bytes: float = 4.0) -> float:
        """Per-sequence recurrent state of linear-attention / Mamba layers (fp32 in vLLM)."""
        return sum(layer.attention.state_elems for layer in self.layers) * state_dtype_bytes

    # ---- FLOPs -----------------------------------------------------------------------------------
    def linear_flops_per_token(self) -> float:
        """Matmul FLOPs per token through all active weights (embedding lookup excluded)."""
        a = self.active_params()
        return 2.0 * (a.attention + a.dense_mlp + a.routed_experts + a.shared_experts + a.head)

    def attn_flops_per_token(self, context: float, phase: Literal["prefill", "decode"] = "decode") -> float:
        return sum(layer.attention.attn_flops_per_token(context, phase) for layer in self.layers)

    def decode_flops_per_token(self, context: float) -> float:
        """FLOPs to generate one token at `context` tokens of history."""
        return self.linear_flops_per_token() + self.attn_flops_per_token(context, "decode")

    def prefill_flops(self, prompt: float, cached: float = 0.0) -> float:
        """FLOPs to prefill `prompt` new tokens after `cached` prefix tokens (causal mask: a
        token at position i attends to i tokens, so the mean context is cached + prompt/2)."""
        mean_ctx = cached + prompt / 2.0
        return prompt * (self.linear_flops_per_token() + self.attn_flops_per_token(mean_ctx, "prefill"))

    # ---- summary -------------------------------------------------------------------------------
    def attention_kinds(self) -> list[str]:
        """The token mixers of the layers, sorted; GQA with one KV head per query head is named
        multi-head attention (mha)."""
        return sorted({"mha" if a.kind == "gqa" and a.n_kv_heads == a.n_heads else a.kind
                       for a in (layer.attention for layer in self.layers)})

    def summary(self, precision: str = "auto") -> dict[str, Any]:
        p = self.params()
        act = self.active_params()
        return {
            "name": self.name,
            "architecture": self.architecture,
            "model_type": self.model_type,
            "layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "attention": self.attention_kinds(),
            "moe": self.is_moe,
            "n_experts": self.n_experts,
            "top_k": self.top_k,
            "checkpoint_format": self.checkpoint_format,
            "fp8_scales": self.fp8_scales,
            "total_params": p.total,
            "active_params": act.total,
            "params": p.as_dict(),
            "active": act.as_dict(),
            "weight_bytes": self.weight_bytes(precision),
            "kv_bytes_per_token_bf16": self.kv_bytes_per_token(2.0),
            "state_bytes_per_seq": self.state_bytes_per_seq(),
            "decode_flops_per_token_at_4k": self.decode_flops_per_token(4096),
            "max_context": self.max_context,
            "source": self.source,
            "notes": list(self.notes),
        }


# ================================================================================================
# Parsing
# ================================================================================================

# Fields whose presence means an architecture feature that this model does not price yet; the
# config is refused with the field named rather than silently mis-counted.
_UNSUPPORTED_FIELDS: dict[str, str] = {
    "block_configs": "per-layer NAS block configs (DeciLM / Nemotron-NAS)",
    "compress_ratios": "compressed sparse attention with per-layer compression ratios (DeepSeek-V4)",
    "hc_mult": "hyper-connections (DeepSeek-V4)",
    "attention_k_eq_v": "shared K=V global attention with per-layer inputs (Gemma 4)",
    "attn_res_block_size": "attention residual blocks with linear-attention layers (Kimi Linear / K3)",
}


# Integer fields of config.json, checked before parsing so that a malformed value is refused
# naming the field (not a bare int() or division error). Sizes that divide or count heads,
# layers or widths must be at least 1; the others (ranks, counts that may be absent) at least 0.
_POSITIVE_INT_FIELDS: tuple[str, ...] = (
    "hidden_size", "d_model", "n_embd", "n_embed", "num_hidden_layers", "n_layers", "n_layer",
    "vocab_size", "num_attention_heads", "n_heads", "n_head", "num_key_value_heads", "num_kv_heads",
    "head_dim", "attention_head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim", "mamba_num_heads", "mamba_head_dim", "ssm_state_size",
    "conv_kernel", "n_groups",
)
_NONNEGATIVE_INT_FIELDS: tuple[str, ...] = (
    "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "ffn_dim", "n_inner",
    "dense_intermediate_size", "intermediate_size_mlp", "shared_intermediate_size", "share_expert_dim",
    "moe_shared_expert_intermediate_size", "moe_latent_size", "n_routed_experts", "num_local_experts",
    "num_experts", "num_experts_per_tok", "experts_per_token", "top_k_experts", "moe_topk", "n_shared_experts",
    "num_shared_experts", "first_k_dense_replace", "interleave_moe_layer_step", "decoder_sparse_step",
    "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_n_heads", "index_topk",
    "index_head_dim", "sliding_window", "sliding_window_size", "swa_head_dim", "swa_v_head_dim",
    "swa_num_key_value_heads", "max_position_embeddings", "seq_length", "n_positions",
)
# Fields that must be JSON lists (of layer indices or per-layer entries) when present.
_LIST_FIELDS: tuple[str, ...] = ("architectures", "mlp_only_layers", "layers_block_type",
                                 "num_key_value_heads_per_layer")


def _check_fields(text: dict[str, Any]) -> None:
    """Refuse malformed values of the fields the parser reads, naming the field."""
    for minimum, names in ((1, _POSITIVE_INT_FIELDS), (0, _NONNEGATIVE_INT_FIELDS)):
        for name in names:
            value = text.get(name)
            if value is None:
                continue
            whole = isinstance(value, int) and not isinstance(value, bool) or \
                isinstance(value, float) and value.is_integer()
            if not whole or value < minimum:
                kind = "a positive integer" if minimum else "a non-negative integer"
                raise ModelConfigError(f"config field {name!r} must be {kind}, got {value!r}")
    for name in _LIST_FIELDS:
        if text.get(name) is not None and not isinstance(text[name], list):
            raise ModelConfigError(f"config field {name!r} must be a list, got {text[name]!r}")
    freq = text.get("moe_layer_freq")
    if freq is not None and not isinstance(freq, int | list) or isinstance(freq, bool):
        raise ModelConfigError(f"config field 'moe_layer_freq' must be an integer or a list, got {freq!r}")
    quant = text.get("quantization_config")
    if quant is not None and not isinstance(quant, dict):
        raise ModelConfigError(f"config field 'quantization_config' must be a JSON object, got {quant!r}")


def _get(cfg: dict[str, Any], *names: str, default: Any = None) -> Any:
    for n in names:
        if n in cfg and cfg[n] is not None:
            return cfg[n]
    return default


def _require(cfg: dict[str, Any], name: str, *alts: str) -> Any:
    v = _get(cfg, name, *alts)
    if v is None:
        raise ModelConfigError(f"config.json lacks required field {name!r}")
    return v


# How FP8 weights are scaled decides the GEMM kernel that serves them. Per 128 x 128 block
# (DeepSeek-V3's scheme) the scales are applied inside the GEMM main loop (DeepGEMM, CUTLASS
# blockwise, Triton w8a8-block kernels); per tensor or per channel they are applied once in the
# epilogue of a plain FP8 GEMM (cuBLASLt, CUTLASS scaled_mm). The published FP8 checkpoints of
# these families all carry quantization_config.weight_block_size [128, 128]
# (shared/data/model-configs: DeepSeek-V3/R1/V3.2/V4, Qwen3 and Qwen3-MoE -FP8, GLM-5 -FP8,
# MiniMax-M2.5/M2.7, Kimi-K2, MiMo-V2-Flash, Step-3.7-Flash -FP8), so a row that serves one of
# them at fp8 from its BF16 config is taken to run that checkpoint. Other families' FP8 comes
# per tensor: NVIDIA's ModelOpt checkpoints (Llama-3.1-70B-Instruct-FP8, whose quantization sits
# outside config.json) and the engines' online `--quantization fp8`.
#
# The price follows the family's checkpoint, while `render` serves a BF16 id at fp8 with the
# engines' online `--quantization fp8`, which scales per tensor: such a deployment prefills faster
# than priced, and its manifest says so (render's fp8-kernels annotation).
FP8_BLOCK_FAMILIES: tuple[str, ...] = ("deepseek", "qwen3", "glm", "minimax", "kimi", "mimo", "step")


def _fp8_scales(cfg: dict[str, Any], text: dict[str, Any], model_type: str, fmt: str) -> str:
    q = cfg.get("quantization_config") or text.get("quantization_config") or {}
    if isinstance(q, dict):
        if q.get("weight_block_size"):
            return "block"
        for group in (q.get("config_groups") or {}).values():  # compressed-tensors
            weights = (group or {}).get("weights") or {}
            if weights.get("num_bits") == 8 and weights.get("type") == "float":
                return "block" if weights.get("strategy") == "block" else "tensor"
    if fmt == "fp8":  # an FP8 checkpoint without block sizes: ModelOpt per tensor
        return "tensor"
    return "block" if model_type.lower().startswith(FP8_BLOCK_FAMILIES) else "tensor"


def _checkpoint_format(cfg: dict[str, Any], text: dict[str, Any]) -> str:
    q = cfg.get("quantization_config") or text.get("quantization_config")
    if not q:
        dtype = str(_get(text, "torch_dtype", "dtype", default=_get(cfg, "torch_dtype", "dtype",
                                                                     default="bfloat16")))
        return "fp16" if "16" in dtype and "b" not in dtype else "bf16"
    method = str(q.get("quant_method", "")).lower()
    algo = str(q.get("quant_algo", "")).upper()
    if method == "mxfp4":
        return "mxfp4"
    if algo == "NVFP4" or algo == "MIXED_PRECISION" and method == "modelopt":
        return "nvfp4"
    if method in ("fp8",) or algo == "FP8":
        return "fp8"
    groups = q.get("config_groups") or {}
    for g in groups.values():
        w = (g or {}).get("weights") or {}
        bits = w.get("num_bits")
        fmt = str(g.get("format", "") or q.get("format", ""))
        if bits == 4:
            if "mxfp4" in fmt:
                return "mxfp4"
            return "nvfp4" if w.get("type") == "float" else "int4"
        if bits == 8:
            return "fp8" if w.get("type") == "float" else "int8"
    if method in ("awq", "gptq"):
        return "int4"
    raise ModelConfigError(
        f"quantization_config.quant_method={method or '?'!r} is not understood; "
        "supported: fp8, mxfp4, modelopt (FP8/NVFP4), compressed-tensors (4/8-bit), awq, gptq"
    )


# Activations of two-matrix (ungated) FFNs: relu2 (Nemotron-H), and the classic GPT-style
# models (OPT relu, GPT-J gelu_new, BLOOM gelu). Gated SwiGLU / GeGLU FFNs have three matrices.
_UNGATED = ("relu2", "relu", "gelu", "gelu_new", "gelu_fast")
_UNGATED_TYPES = ("opt", "gptj", "bloom", "gpt2", "gpt_neox", "falcon")


def _gated_mlp(hidden: int, inter: int, act: str = "silu") -> int:
    return (2 if act in _UNGATED else 3) * hidden * inter


def _ffn_width(inter: int, act: str = "silu") -> int:
    """Columns of the FFN's first GEMM (see MLPSpec.dense_width)."""
    return (1 if act in _UNGATED else 2) * inter


def _gqa(hidden: int, heads: int, kv_heads: int, head_dim: int, window: int | None = None,
         v_head_dim: int | None = None, bias: bool = False) -> AttentionSpec:
    v_dim = v_head_dim or head_dim
    params = hidden * heads * head_dim + hidden * kv_heads * (head_dim + v_dim) + heads * v_dim * hidden
    if bias:
        params += heads * head_dim + kv_heads * (head_dim + v_dim) + hidden
    return AttentionSpec(
        kind="gqa", n_heads=heads, n_kv_heads=kv_heads, qk_head_dim=head_dim, v_head_dim=v_dim,
        params=params, window=window, kv_elems_per_token=kv_heads * (head_dim + v_dim),
    )


def _mla(text: dict[str, Any], hidden: int) -> AttentionSpec:
    heads = int(_require(text, "num_attention_heads"))
    q_lora = int(_get(text, "q_lora_rank", default=0) or 0)
    kv_lora = int(_require(text, "kv_lora_rank"))
    nope = int(_require(text, "qk_nope_head_dim"))
    rope = int(_require(text, "qk_rope_head_dim"))
    v_dim = int(_require(text, "v_head_dim"))
    qk = nope + rope
    q_params = hidden * q_lora + q_lora * heads * qk + q_lora if q_lora else hidden * heads * qk
    kv_params = hidden * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim)
    o_params = heads * v_dim * hidden
    params = q_params + kv_params + o_params
    # DeepSeek-V3.2 / GLM-5 sparse attention indexer (DSA): a small extra attention that scores
    # tokens; its projections are weights, and it caches index keys (index_head_dim per token).
    idx_heads = int(_get(text, "index_n_heads", default=0) or 0)
    idx_dim = int(_get(text, "index_head_dim", default=0) or 0)
    kv_elems = kv_lora + rope
    topk = 0
    if idx_heads and idx_dim:
        params += (q_lora or hidden) * idx_heads * idx_dim + hidden * idx_dim + hidden * idx_heads
        kv_elems += idx_dim
        topk = int(_get(text, "index_topk", default=0) or 0)
    return AttentionSpec(
        kind="mla", n_heads=heads, n_kv_heads=1, qk_head_dim=qk, v_head_dim=v_dim, params=params,
        kv_elems_per_token=kv_elems, kv_lora_rank=kv_lora, qk_rope_head_dim=rope,
        index_topk=topk, index_heads=idx_heads if topk else 0, index_head_dim=idx_dim if topk else 0,
    )


def _moe_layer_flags(text: dict[str, Any], n_layers: int) -> list[bool]:
    """Which layers are MoE: first_k_dense_replace, moe_layer_freq (int or list),
    decoder_sparse_step / mlp_only_layers (Qwen), interleave_moe_layer_step (Llama 4)."""
    freq = _get(text, "moe_layer_freq", default=1)
    first_k = int(_get(text, "first_k_dense_replace", default=0) or 0)
    if isinstance(freq, list):
        if len(freq) < n_layers:
            raise ModelConfigError(f"moe_layer_freq has {len(freq)} entries for {n_layers} layers")
        flags = [bool(x) for x in freq[:n_layers]]
    else:
        step = int(_get(text, "interleave_moe_layer_step", "decoder_sparse_step", default=freq) or 1)
        flags = [(i + 1) % step == 0 for i in range(n_layers)]
    only_dense = set(_get(text, "mlp_only_layers", default=[]) or [])
    return [f and i >= first_k and i not in only_dense for i, f in enumerate(flags)]


def _layer_windows(text: dict[str, Any], n_layers: int) -> list[int | None]:
    window = _get(text, "sliding_window", "sliding_window_size")
    types = _get(text, "layer_types")
    pattern = _get(text, "hybrid_layer_pattern")
    for name, per_layer in (("layer_types", types), ("hybrid_layer_pattern", pattern)):
        if isinstance(per_layer, list) and len(per_layer) < n_layers:
            raise ModelConfigError(f"{name} has {len(per_layer)} entries for {n_layers} layers")
    if isinstance(types, list):
        return [int(window) if t == "sliding_attention" and window else None for t in types[:n_layers]]
    if isinstance(pattern, list):  # MiMo-V2: 1 = sliding window layer
        return [int(window) if p == 1 and window else None for p in pattern[:n_layers]]
    if window and _get(text, "use_sliding_window", default=True) is not False and \
            text.get("model_type") in ("mistral", "mixtral", "qwen2") and int(window) < int(
                _get(text, "max_position_embeddings", default=1 << 30)):
        return [int(window)] * n_layers
    return [None] * n_layers


def _parse_mamba_pattern(text: dict[str, Any], hidden: int) -> list[LayerSpec]:
    """Nemotron-H: `hybrid_override_pattern` with M = Mamba-2, * = attention, - = MLP, E = MoE.
    Each character is its own block; we fold it into one LayerSpec per character."""
    block_types = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
    if isinstance(text.get("layers_block_type"), list):
        try:
            pattern = "".join(block_types[b] for b in text["layers_block_type"])
        except KeyError as exc:
            raise ModelConfigError(f"layers_block_type entry {exc.args[0]!r} is not understood "
                                   f"({', '.join(block_types)})") from None
    else:
        pattern = str(_require(text, "hybrid_override_pattern"))
    heads = int(_require(text, "num_attention_heads"))
    kv = int(_require(text, "num_key_value_heads"))
    hd = int(_get(text, "head_dim", "attention_head_dim", default=hidden // heads))
    m_heads = int(_require(text, "mamba_num_heads"))
    m_hd = int(_require(text, "mamba_head_dim"))
    groups = int(_get(text, "n_groups", default=1))
    d_state = int(_require(text, "ssm_state_size"))
    conv_k = int(_get(text, "conv_kernel", default=4))
    act = str(_get(text, "mlp_hidden_act", default="relu2"))
    d_inner = m_heads * m_hd
    conv_dim = d_inner + 2 * groups * d_state
    mamba_params = hidden * (2 * d_inner + 2 * groups * d_state + m_heads) + conv_dim * conv_k \
        + d_inner * hidden + 3 * m_heads + d_inner
    mamba = AttentionSpec(
        kind="mamba", n_heads=m_heads, n_kv_heads=m_heads, qk_head_dim=m_hd, v_head_dim=m_hd,
        params=mamba_params, state_elems=m_heads * m_hd * d_state + conv_dim * (conv_k - 1),
    )
    none_attn = AttentionSpec(kind="gqa", n_heads=0, n_kv_heads=0, qk_head_dim=0, v_head_dim=0, params=0)
    no_mlp = MLPSpec(kind="dense")
    dense_inter = int(_require(text, "intermediate_size"))
    dense = MLPSpec(kind="dense", dense_params=_gated_mlp(hidden, dense_inter, act),
                    dense_width=_ffn_width(dense_inter, act))
    n_exp = int(_get(text, "n_routed_experts", default=0) or 0)
    moe = None
    if n_exp:
        e_inter = int(_require(text, "moe_intermediate_size"))
        s_inter = int(_get(text, "moe_shared_expert_intermediate_size", default=0) or 0)
        # Latent MoE (Nemotron 3 Super/Ultra): routed experts work in a smaller latent width,
        # reached through one down- and one up-projection shared by all experts of the layer.
        latent = int(_get(text, "moe_latent_size", default=0) or 0)
        expert_width = latent or hidden
        moe = MLPSpec(
            kind="moe", n_experts=n_exp, top_k=int(_require(text, "num_experts_per_tok")),
            expert_params=_gated_mlp(expert_width, e_inter, act),
            shared_params=_gated_mlp(hidden, s_inter, act) * int(_get(text, "n_shared_experts", default=1))
            + (2 * hidden * latent if latent else 0),
            router_params=hidden * n_exp,
            expert_width=_ffn_width(e_inter, act), shared_width=_ffn_width(s_inter, act),
        )
    layers = []
    for ch in pattern:
        if ch == "M":
            layers.append(LayerSpec(mamba, no_mlp, hidden))
        elif ch == "*":
            layers.append(LayerSpec(_gqa(hidden, heads, kv, hd), no_mlp, hidden))
        elif ch == "-":
            layers.append(LayerSpec(none_attn, dense, hidden))
        elif ch == "E":
            if moe is None:
                raise ModelConfigError(
                    "hybrid_override_pattern has 'E' (MoE) but n_routed_experts is missing")
            layers.append(LayerSpec(none_attn, moe, hidden))
        else:
            raise ModelConfigError(f"hybrid_override_pattern character {ch!r} is not understood (M, *, -, E)")
    return layers


def _linear_attention(text: dict[str, Any], hidden: int) -> AttentionSpec:
    """Qwen3.5 / Qwen3-Next gated DeltaNet layer: q,k (key heads), v (value heads), gates,
    output; recurrent state per value head of key_dim x value_dim, plus a short conv."""
    kh = int(_require(text, "linear_num_key_heads"))
    vh = int(_require(text, "linear_num_value_heads"))
    kd = int(_require(text, "linear_key_head_dim"))
    vd = int(_require(text, "linear_value_head_dim"))
    conv_k = int(_get(text, "linear_conv_kernel_dim", default=4))
    qkv = 2 * kh * kd + vh * vd
    params = hidden * qkv + hidden * vh * vd + 2 * hidden * vh + vh * vd * hidden + qkv * conv_k
    return AttentionSpec(
        kind="linear", n_heads=vh, n_kv_heads=kh, qk_head_dim=kd, v_head_dim=vd, params=params,
        state_elems=vh * kd * vd + qkv * (conv_k - 1),
    )


def model_from_config(config: dict[str, Any] | str | Path, name: str | None = None,
                      source: str = "") -> ModelSpec:
    """Build a ModelSpec from a config.json dict or path. Raises ModelConfigError naming the
    field when the architecture is not understood."""
    if not isinstance(config, dict):
        path = Path(config)
        try:
            config = json.loads(read_user_text(path, "config file"))
        except UserFileError as exc:
            raise ModelConfigError(str(exc)) from None
        except json.JSONDecodeError as exc:
            raise ModelConfigError(f"{path} is not valid JSON: {exc}") from exc
        source = source or str(path)
        name = name or _name_from_filename(path.name)
    if not isinstance(config, dict):
        raise ModelConfigError("config.json must hold a JSON object")
    text = config.get("text_config") or config.get("llm_config") or config
    if not isinstance(text, dict):
        raise ModelConfigError("text_config must be a JSON object")
    for fld, what in _UNSUPPORTED_FIELDS.items():
        if fld in text and text[fld] not in (None, [], 0, False):
            raise ModelConfigError(f"unsupported config field {fld!r}: {what} is not modelled yet")
    for part in (config, text) if text is not config else (text,):
        _check_fields(part)
    arch = (config.get("architectures") or text.get("architectures") or [None])[0]
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    hidden = int(_require(text, "hidden_size", "d_model", "n_embd", "n_embed"))
    if isinstance(text.get("layers_block_type"), list):
        n_layers = len(text["layers_block_type"])
    else:
        n_layers = int(_require(text, "num_hidden_layers", "n_layers", "n_layer"))
    vocab = int(_require(text, "vocab_size"))
    tie = bool(_get(text, "tie_word_embeddings", default=_get(config, "tie_word_embeddings", default=False)))
    max_ctx = int(_get(text, "max_position_embeddings", "seq_length", "n_positions", default=0) or 0)
    if max_ctx <= 0:
        # Without it every length check (prompts, --max-model-len, KV sizing) would pass silently.
        raise ModelConfigError("config.json has no max_position_embeddings (nor seq_length, n_positions): the model's "
                               "context length is unknown; add max_position_embeddings, as the model's Hugging Face "
                               "config.json has it")
    fmt = _checkpoint_format(config, text)
    if fmt in ("bf16", "fp16") and name:
        # NVIDIA's NVFP4/FP8 repositories keep quantization in hf_quant_config.json, not in
        # config.json; the repository name is then the only sign of the checkpoint format.
        upper = name.upper()
        fmt = "nvfp4" if "NVFP4" in upper else "fp8" if "FP8" in upper else fmt
    notes: list[str] = []
    act = str(_get(text, "hidden_act", "hidden_activation", "activation_function", default="silu"))
    if model_type in _UNGATED_TYPES and act not in _UNGATED:
        act = "gelu"

    if "hybrid_override_pattern" in text or "layers_block_type" in text:
        layers = _parse_mamba_pattern(text, hidden)
        notes.append("hybrid Mamba-2/attention: per-sequence SSM state, KV only on attention layers")
    else:
        heads = int(_require(text, "num_attention_heads", "n_heads", "n_head"))
        kv_heads = int(_get(text, "num_key_value_heads", "num_kv_heads", default=heads))
        if kv_heads > heads or heads % kv_heads:
            # Grouped-query attention shares each KV head among an equal group of query heads.
            raise ModelConfigError(f"config field 'num_key_value_heads' ({kv_heads}) must divide "
                                   f"'num_attention_heads' ({heads}): each KV head serves an equal group of "
                                   "query heads")
        kv_per_layer = text.get("num_key_value_heads_per_layer")  # DeciLM: GQA width per layer
        head_dim = int(_get(text, "head_dim", default=hidden // heads))
        v_head_dim = _get(text, "v_head_dim")
        bias = bool(_get(text, "attention_bias", "qkv_bias", default=model_type.startswith("qwen2")))
        windows = _layer_windows(text, n_layers)
        types = text.get("layer_types") if isinstance(text.get("layer_types"), list) else None
        use_mla = "kv_lora_rank" in text and text.get("kv_lora_rank")
        moe_flags = _moe_layer_flags(text, n_layers)
        n_exp = int(_get(text, "n_routed_experts", "num_local_experts", "num_experts", default=0) or 0)
        top_k = int(_get(text, "num_experts_per_tok", "experts_per_token", "top_k_experts",
                         "moe_topk", default=0) or 0)
        dense_inter = int(_get(text, "dense_intermediate_size", "intermediate_size_mlp",
                               "intermediate_size", "ffn_dim", "n_inner", default=0) or 0)
        if not dense_inter and model_type in _UNGATED_TYPES:
            dense_inter = 4 * hidden  # GPT-J / BLOOM: FFN width 4 x hidden when n_inner is null
        if n_exp:
            expert_inter = int(_get(text, "moe_intermediate_size", default=0) or 0)
            if not expert_inter:
                # Mixtral, gpt-oss, MiniMax-M2, Llama 4: experts use `intermediate_size`.
                expert_inter = int(_require(text, "intermediate_size"))
                if model_type.startswith("llama4"):
                    dense_inter = int(_get(text, "intermediate_size_mlp", default=expert_inter))
            shared_inter = int(_get(text, "shared_expert_intermediate_size", "shared_intermediate_size",
                                    "share_expert_dim", default=0) or 0)
            n_shared = _get(text, "n_shared_experts", "num_shared_experts")
            shared_width = _ffn_width(shared_inter or expert_inter)
            if shared_inter:
                n_shared = 1 if n_shared is None else int(n_shared)
                shared_params = n_shared * _gated_mlp(hidden, shared_inter)
            elif n_shared:
                shared_params = int(n_shared) * _gated_mlp(hidden, expert_inter)
            elif model_type.startswith("llama4"):
                shared_params = _gated_mlp(hidden, expert_inter)  # Llama 4 has one shared expert
            else:
                shared_params = 0
            if not top_k:
                raise ModelConfigError("MoE config lacks 'num_experts_per_tok' (top-k)")
            moe = MLPSpec(kind="moe", n_experts=n_exp, top_k=top_k,
                          expert_params=_gated_mlp(hidden, expert_inter), shared_params=shared_params,
                          router_params=hidden * n_exp, expert_width=_ffn_width(expert_inter),
                          shared_width=shared_width if shared_params else 0)
        else:
            moe = None
        if not dense_inter and (moe is None or not all(moe_flags)):
            raise ModelConfigError("config.json lacks required field 'intermediate_size'")
        dense_mlp = MLPSpec(kind="dense", dense_params=_gated_mlp(hidden, dense_inter, act),
                            dense_width=_ffn_width(dense_inter, act))
        layers = []
        for i in range(n_layers):
            kind = types[i] if types and i < len(types) else "full_attention"
            if kind == "linear_attention":
                attn = _linear_attention(text, hidden)
            elif use_mla:
                attn = _mla(text, hidden)
            elif kind not in ("full_attention", "sliding_attention", "attention"):
                raise ModelConfigError(f"layer_types entry {kind!r} is not understood")
            else:
                hd, vd, kvh = head_dim, v_head_dim, kv_heads
                if isinstance(kv_per_layer, list) and i < len(kv_per_layer):
                    kvh = int(kv_per_layer[i])
                if windows[i] and _get(text, "swa_head_dim"):
                    hd = int(text["swa_head_dim"])
                    vd = _get(text, "swa_v_head_dim", default=vd)
                    kvh = int(_get(text, "swa_num_key_value_heads", default=kv_heads))
                attn = _gqa(hidden, heads, kvh, hd, windows[i], int(vd) if vd else None, bias)
            mlp = moe if (moe is not None and moe_flags[i]) else dense_mlp
            layers.append(LayerSpec(attn, mlp, 2 * hidden))
        if any(w for w in windows):
            notes.append("sliding-window layers: KV stops growing at the window")
        if use_mla:
            notes.append("MLA: KV cache holds the compressed latent (kv_lora_rank + rope dims)")
    return ModelSpec(
        name=name or str(text.get("_name_or_path") or arch or model_type),
        architecture=str(arch or model_type), model_type=model_type, hidden_size=hidden,
        vocab_size=vocab, layers=tuple(layers), tie_embeddings=tie, checkpoint_format=fmt,
        max_context=max_ctx, source=source, notes=tuple(notes),
        fp8_scales=_fp8_scales(config, text, model_type, fmt),
    )


# ================================================================================================
# The shipped catalog and name resolution
# ================================================================================================

def _name_from_filename(filename: str) -> str:
    stem = filename.removesuffix(".json").removesuffix("_config")
    return stem.replace("--", "/")


def _config_dir() -> Path:
    return Path(str(resources.files("inferasim.catalog") / "configs"))


@cache
def _catalog_files() -> dict[str, Path]:
    out = {}
    for path in sorted(_config_dir().glob("*_config.json")):
        out[_name_from_filename(path.name)] = path
    return out


# Different spellings of one architecture seen in data files and on the Hub. Checkpoint variants
# (-Instruct, -FP8, ...) share the architecture; precision is a separate serving choice.
MODEL_ALIASES: dict[str, str] = {
    "meta-llama/Llama-3.1-8B": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-405B": "meta-llama/Meta-Llama-3.1-405B",
    "meta-llama/Llama-3.3-70B-Instruct": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3-8B": "meta-llama/Meta-Llama-3-8B",
    "meta-llama/Llama-3-70B": "meta-llama/Meta-Llama-3-70B",
    "zhipuai/GLM-5": "zai-org/GLM-5",
    "THUDM/GLM-5": "zai-org/GLM-5",
    "deepseek-ai/DeepSeek-V3-0324": "deepseek-ai/DeepSeek-V3",
    "deepseek-ai/DeepSeek-R1-0528": "deepseek-ai/DeepSeek-R1",
    "deepseek-ai/DeepSeek-V3.1": "deepseek-ai/DeepSeek-V3",
    "moonshotai/Kimi-K2-Thinking": "moonshotai/Kimi-K2.5",
    # Distilled into Llama-3.3-70B-Instruct, whose architecture is Llama-3.1-70B's (the R1 model card).
    "deepseek-ai/DeepSeek-R1-Distill-Llama-70B": "meta-llama/Meta-Llama-3.1-70B",
    # One architecture class, MiniMaxM2ForCausalLM (model_type minimax_m2, as M2.5's and M2.7's
    # configs in shared/data/model-configs name it): 230B total, 10B active since M2.
    "MiniMaxAI/MiniMax-M2": "MiniMaxAI/MiniMax-M2.5",
    "MiniMaxAI/MiniMax-M2.1": "MiniMaxAI/MiniMax-M2.5",
    # Qwen2.5 kept Qwen2's 7B and 72B shapes (Qwen2.5 technical report, arXiv 2412.15115, table 1:
    # 28 layers, 28/4 heads for 7B; 80 layers, 64/8 heads for 72B).
    "Qwen/Qwen2.5-7B": "Qwen/Qwen2-7B",
    "Qwen/Qwen2.5-72B": "Qwen/Qwen2-72B",
}

# Checkpoint suffixes: tuning, precision and quantizer spellings that keep the architecture. The
# quantizers' own checkpoints are the ones public benchmarks serve: AMD's "-FP8-KV" (FP8 weights and
# KV scales, amd/Llama-3.1-70B-Instruct-FP8-KV) and "-MXFP4-Preview" (amd/DeepSeek-R1-0528-MXFP4-
# Preview), NVIDIA's "-FP4" (nvidia/DeepSeek-R1-FP4), AWQ/GPTQ and compressed-tensors "-W4A16".
_SUFFIXES = ("-instruct", "-hf", "-base", "-chat", "-it", "-fp8", "-nvfp4", "-bf16", "-thinking",
             "-fp8-dynamic", "-v0.1", "-instruct-2507", "-instruct-fp8", "-fp8-kv", "-fp4", "-mxfp4",
             "-preview", "-exp", "-awq", "-gptq-int4", "-int4", "-w4a16", "-w8a8")
# A release date closing the name (DeepSeek-R1-0528, Kimi-K2-Instruct-0905, DeepSeek-V3-0324): a
# retrained checkpoint of the same architecture. Sizes never end a name as four bare digits.
_RELEASE_DATE = re.compile(r"-\d{4}$")


def _canon(name: str) -> str:
    s = name.strip().lower()
    # The name, not its org or folders: "org/Name", a local "/models/Name/" and "Name" alike.
    s = s.rstrip("/").rsplit("/", 1)[-1]
    s = s.removeprefix("meta-")
    changed = True
    while changed:
        changed = False
        for suf in _SUFFIXES:
            if s.endswith(suf):
                s = s[: -len(suf)]
                changed = True
        dated = _RELEASE_DATE.sub("", s)
        if dated != s and dated:
            s, changed = dated, True
    return re.sub(r"[_\s]", "-", s)


@cache
def _canon_index() -> dict[str, str]:
    index: dict[str, str] = {}
    # Prefer the authors' own configs, then the aliases (which name authors' configs too), and only
    # then a quantizer's derivative: "DeepSeek-V3.1" is deepseek-ai's model (alias DeepSeek-V3), not
    # nvidia/DeepSeek-V3.1-NVFP4, whose weights are half the bytes.
    derivative = ("nvidia/", "sgl-project/")
    for hf_id in sorted(n for n in _catalog_files() if not n.startswith(derivative)):
        index.setdefault(_canon(hf_id), hf_id)
    for alias, target in MODEL_ALIASES.items():
        if target in _catalog_files():
            index.setdefault(_canon(alias), target)
    for hf_id in sorted(n for n in _catalog_files() if n.startswith(derivative)):
        index.setdefault(_canon(hf_id), hf_id)
    return index


@cache
def _alias_by_leaf() -> dict[str, str]:
    """Each alias's name without its org (kimi-k2-thinking), lower-cased, to its catalog target."""
    return {k.rsplit("/", 1)[-1].lower(): t for k, t in MODEL_ALIASES.items() if t in _catalog_files()}


def _squeeze(canon: str) -> str:
    return re.sub(r"[-_.]", "", canon)


@cache
def _squeezed_index() -> dict[str, str]:
    targets: dict[str, set[str]] = {}
    for canon, hf_id in _canon_index().items():
        targets.setdefault(_squeeze(canon), set()).add(hf_id)
    return {key: next(iter(ids)) for key, ids in targets.items() if len(ids) == 1}


def known_models() -> list[str]:
    return sorted(_catalog_files())


def resolve_model_name(name: str, *, paths_hint: bool = True) -> str:
    """Hugging Face id of a known model for `name` (exact id, file-style `org--name`, alias, or
    a spelling that differs only in org, `Meta-` prefix or checkpoint suffix). ``paths_hint``: the
    error suggests a config.json path (not where paths are refused)."""
    files = _catalog_files()
    candidate = name.strip().replace("--", "/")
    if candidate in files:
        return candidate
    if candidate in MODEL_ALIASES and MODEL_ALIASES[candidate] in files:
        return MODEL_ALIASES[candidate]
    lower = {k.lower(): k for k in files}
    if candidate.lower() in lower:
        return lower[candidate.lower()]
    # An alias's checkpoint in a local folder or under another org (/models/Kimi-K2-Thinking): the
    # alias holds, before any suffix is dropped (dropping "-Thinking" would name Kimi-K2-Instruct).
    by_leaf = _alias_by_leaf().get(candidate.rstrip("/").rsplit("/", 1)[-1].lower())
    if by_leaf:
        return by_leaf
    hit = _canon_index().get(_canon(candidate))
    if hit:
        return hit
    # Separators written another way (llama3.3-70b, Qwen3_32B, gpt_oss_120b): the same name once
    # "-", "_" and "." are dropped, where that names one model only.
    squeezed = _squeezed_index().get(_squeeze(_canon(candidate)))
    if squeezed:
        return squeezed
    close = difflib.get_close_matches(candidate, list(files), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UnknownModelError(
        f"unknown model {name!r}: give a Hugging Face id from `inferasim models`"
        + (" or a path to a config.json" if paths_hint else " (paths to config files are not accepted here)")
        + hint
    )


@cache
def _load_known(hf_id: str) -> ModelSpec:
    path = _catalog_files()[hf_id]
    return model_from_config(json.loads(path.read_text()), name=hf_id,
                             source=f"inferasim/catalog/configs/{path.name}")


def context_error(model: ModelSpec, prompt: float, output: float = 0.0) -> str | None:
    """Why `prompt` (+ `output`) tokens do not fit `model`'s context (max_position_embeddings), or
    None. A prompt beyond it cannot even be prefilled; prompt + output beyond it is refused by the
    engines' API servers but runs, cut at the context, in offline benchmarks (the public Argonne
    data has 2048 + 2048 tokens on 2048-context models), so callers refuse the first and note the
    second."""
    need = prompt + output
    if model.max_context > 0 and need > model.max_context:
        what = "prompt" if not output else "prompt + output"
        return (f"{what} = {need:.0f} tokens exceeds {model.name}'s context of {model.max_context} "
                "tokens (max_position_embeddings)")
    return None


def exact_catalog_id(name: str) -> str | None:
    """The catalog id `name` names exactly (the id in any case, its file-style spelling, or an
    alias), or None; unlike resolve_model_name, no spelling that only shares the canonical name
    (an -Instruct or -FP8 variant is another checkpoint)."""
    files = _catalog_files()
    candidate = name.strip().replace("--", "/")
    if candidate in MODEL_ALIASES and MODEL_ALIASES[candidate] in files:
        return MODEL_ALIASES[candidate]
    return {k.lower(): k for k in files}.get(candidate.lower())


def sibling_checkpoints(name: str) -> dict[str, str]:
    """Catalog checkpoints of the same model as `name` (the same id once org, `Meta-` prefix and
    checkpoint suffixes are dropped; instruction-tuned or not, like `name`), each with its weight
    format: where to point a deployment that needs another precision
    (nvidia/Llama-3.1-70B-Instruct-FP8 for meta-llama/Llama-3.1-70B-Instruct)."""
    key = _canon(name.replace("--", "/"))
    instruct = "instruct" in name.lower()
    out: dict[str, str] = {}
    for hf_id in sorted(_catalog_files()):
        if _canon(hf_id) == key and ("instruct" in hf_id.lower()) == instruct:
            try:
                out[hf_id] = _load_known(hf_id).checkpoint_format
            except ModelConfigError:
                continue  # a config the catalog cannot read is not a place to point anyone
    return out


# A Hugging Face repo id, `org/name` (or `name`, or the shared files' `org--name`): letters, digits,
# `-`, `_` and `.`, each part starting with a letter or digit. No leading `/`, `.` or `~`, at most one
# `/`, and no `..`: nothing that names a place on a filesystem other than as a relative `org/name`.
MODEL_ID_MAX_LENGTH = 200
MODEL_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$"
_MODEL_ID = re.compile(MODEL_ID_PATTERN)


def check_model_id(name: str) -> str:
    """`name` if it is shaped as a Hugging Face id (MODEL_ID_PATTERN); UnknownModelError otherwise.

    Pure string rules: the message is one and the same whatever exists on the filesystem, so that a
    service resolving names for others (the operator) never reveals which paths exist."""
    if not isinstance(name, str) or len(name) > MODEL_ID_MAX_LENGTH or not _MODEL_ID.match(name) or ".." in name \
            or name.lower().endswith(".json"):
        shown = repr(name[:60] + "...") if isinstance(name, str) and len(name) > 60 else repr(name)
        raise UnknownModelError(f"{shown} is not a Hugging Face id (org/name, at most {MODEL_ID_MAX_LENGTH} "
                                "characters of letters, digits, '-', '_' and '.') nor a model the catalog knows; "
                                "paths to config files are not accepted here")
    return name


_model_paths = True  # the process default of get_model's allow_path (see refuse_model_paths)


def refuse_model_paths() -> None:
    """From now on, in this process, get_model resolves names only unless a caller passes
    ``allow_path=True``: the operator calls it at startup and in its search process, so that no
    code path of the library (the search, rendering, calibration) opens a file a spec named."""
    global _model_paths
    _model_paths = False


def get_model(name_or_path: str | Path, *, allow_path: bool | None = None) -> ModelSpec:
    """A ModelSpec by Hugging Face id / alias, or from a config.json path (a file, or a folder
    holding config.json).

    ``allow_path=False`` resolves names only, through the shipped catalog, and never touches the
    filesystem for the name: a service taking model names from others (the Kubernetes operator)
    must not open ``/etc/passwd`` because a spec named it, nor say whether it exists. None: the
    process default (True unless refuse_model_paths was called)."""
    text = str(name_or_path)
    if not (_model_paths if allow_path is None else allow_path):
        return _load_known(resolve_model_name(check_model_id(text), paths_hint=False))
    path = Path(text)
    try:
        is_path = text.endswith(".json") or path.is_dir() or (path.exists() and path.is_file())
    except OSError:  # a name no filesystem takes (a component over 255 bytes): not a path, so a name
        is_path = False
    if is_path:
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise UnknownModelError(f"config file {path} does not exist")
        return model_from_config(path)
    return _load_known(resolve_model_name(text))
