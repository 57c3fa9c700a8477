"""The plan a PyTorch step harvest runs (`inferasim harvest torch-plan`): shapes and step grid.

The harness (`torchstep.py`) knows no catalog; this module reads the model's config from the
catalog and writes what the harness needs: the layer shapes, the weight bytes (to size the KV
cache beside them) and which steps to time. The grid is chosen for the step-time model's terms:
decode at B = 1 .. 256 sequences and C = 256 .. 8192 cached tokens separates the weight read
(e_bw: B = 1, short C) from the KV read (e_kv: large B x C) and the GEMM roof (e_flops, m_tile:
large B); prefill chunks of 256 .. 8192 tokens pin e_flops and the quadratic attention (e_attn);
mixed steps check that the terms add as step_time() adds them.
"""

from __future__ import annotations

from typing import Any

from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import ModelSpec
from inferasim.errors import UserError

DECODE_BATCHES = (1, 4, 16, 64, 128, 256)
DECODE_CONTEXTS = (256, 1024, 4096, 8192)
PREFILL_TOKENS = (256, 1024, 2048, 4096, 8192)
MIXED = ((16, 1024, 512), (64, 2048, 1024), (32, 4096, 2048))
# The harness keeps this much of the card free beyond weights and KV (torchstep.HEADROOM_BYTES).
HEADROOM_BYTES = 10 * 2**30


class UnsupportedArchitecture(UserError, ValueError):
    """The harness builds dense decoders with grouped-query (or multi-head) attention only."""


def torch_arch(model: ModelSpec) -> dict[str, Any]:
    """The harness's shapes of `model`: every layer the same dense GQA/MHA block, or an error
    naming what differs (experts, MLA, sliding windows, linear attention are not built)."""
    layers = model.layers
    first = layers[0]
    att, mlp = first.attention, first.mlp
    why = []
    if att.kind not in ("gqa", "mha"):
        why.append(f"attention kind {att.kind!r}")
    if mlp.kind != "dense":
        why.append(f"MLP kind {mlp.kind!r}")
    if att.window:
        why.append("sliding-window attention")
    if any(layer != first for layer in layers):
        why.append("layers of different shapes")
    if att.qk_head_dim != att.v_head_dim:
        why.append("different query/key and value head sizes")
    if why:
        raise UnsupportedArchitecture(
            f"model {model.name}: the PyTorch step harness builds uniform dense decoders with grouped-query "
            f"attention; this one has {', '.join(why)}. Harvest it from a running engine instead "
            f"(`inferasim harvest run --endpoint ...`).")
    intermediate = mlp.dense_params // (3 * model.hidden_size)
    return {"hidden": model.hidden_size, "layers": len(layers), "heads": att.n_heads, "kv_heads": att.n_kv_heads,
            "head_dim": att.qk_head_dim, "intermediate": intermediate, "vocab": model.vocab_size,
            # Qwen3 normalises each query and key head before the rotary embedding (its config's
            # model_type "qwen3"; the Qwen3 modelling code applies q_norm / k_norm per head).
            "qk_norm": model.model_type in ("qwen3",)}


def shard(arch: dict[str, Any], tp: int) -> dict[str, Any]:
    """One GPU's slice of `arch` under tensor parallelism `tp`, as vLLM and SGLang split it: query
    heads, the MLP's intermediate width and the vocabulary (LM head) divided by tp; KV heads
    divided too, or replicated once tp exceeds them (one KV head per GPU at least); the hidden
    width whole. The all-reduces are not run: the slice's kernels are what the harness times."""
    if tp < 1 or arch["heads"] % tp or arch["intermediate"] % tp:
        raise UserError(f"tp {tp} does not divide the model's {arch['heads']} query heads and "
                        f"{arch['intermediate']} intermediate width; pick a divisor")
    if arch["kv_heads"] % tp and tp % arch["kv_heads"]:
        raise UserError(f"tp {tp} neither divides nor is a multiple of the model's {arch['kv_heads']} KV heads")
    return {**arch, "heads": arch["heads"] // tp, "kv_heads": max(1, arch["kv_heads"] // tp),
            "intermediate": arch["intermediate"] // tp, "vocab": -(-arch["vocab"] // tp)}


def kv_bytes_per_token(arch: dict[str, Any]) -> int:
    return 2 * arch["layers"] * arch["kv_heads"] * arch["head_dim"] * 2


def weight_bytes(arch: dict[str, Any]) -> int:
    """bf16 bytes of the weights the harness allocates (embedding and LM head untied)."""
    h, d = arch["hidden"], arch["head_dim"]
    per_layer = (h * (arch["heads"] + 2 * arch["kv_heads"]) * d + h * arch["heads"] * d +
                 3 * h * arch["intermediate"])
    return 2 * (arch["layers"] * per_layer + 2 * arch["vocab"] * h)


def torch_plan(models: list[ModelSpec], gpu: GPU, tps: tuple[int, ...] = (1,)) -> dict[str, Any]:
    """The plan for `models` on `gpu` at each tensor width of `tps` (one GPU's slice of it):
    steps whose KV fits beside the weights, contexts within the model's own maximum. UserError
    when a slice's weights alone do not fit on one card."""
    entries = []
    for model, tp in ((m, t) for m in models for t in tps):
        arch = shard(torch_arch(model), tp)
        wbytes = weight_bytes(arch)
        room = gpu.hbm_bytes - wbytes - HEADROOM_BYTES
        if room <= 0:
            raise UserError(f"model {model.name}: {wbytes / 2**30:.0f} GiB of bf16 weights do not fit on one "
                            f"{gpu.name} ({gpu.hbm_bytes / 2**30:.0f} GiB) with {HEADROOM_BYTES / 2**30:.0f} GiB "
                            "to spare; the harness times one card (tp 1): pick a smaller model")
        kv_tokens = int(room // kv_bytes_per_token(arch))
        ctxs = [c for c in DECODE_CONTEXTS if c <= model.max_context]
        decode = [[b, c] for c in ctxs for b in DECODE_BATCHES if b * c <= kv_tokens]
        prefill = [t for t in PREFILL_TOKENS if t <= model.max_context]
        mixed = [[b, c, t] for b, c, t in MIXED if b * c <= kv_tokens and c <= model.max_context]
        entries.append({"model": model.name, "tp": tp, "arch": arch, "weight_bytes": wbytes, "decode": decode,
                        "prefill": prefill, "mixed": mixed, "cuda_graph": True})
    return {"schema": "inferasim-torchplan/1", "gpu": gpu.name, "models": entries}
