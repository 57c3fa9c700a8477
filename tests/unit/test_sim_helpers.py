"""Helpers of the trace-simulator tests: small deployments and synthetic Mooncake traces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.model.predictor import FittedAnchor, unanchored

MODEL = get_model("meta-llama/Meta-Llama-3.1-8B")
GPU = get_gpu("H100")


def fitted(engine: str = "vllm", layout: Layout | None = None) -> FittedAnchor:
    return unanchored(engine, MODEL, GPU, "bf16", layout or Layout(tp=1))


def conversations(n_conv: int = 12, turns: int = 6, seed: int = 0, gap_s: float = 0.4, system_blocks: int = 2,
                  out_range: tuple[int, int] = (16, 160)) -> list[dict]:
    """Mooncake-style records: every conversation starts with a shared system prompt of
    `system_blocks` 512-token blocks; turn k repeats turn k-1's blocks and adds 1-3 new ones;
    the last block is partial. Conversations interleave in time."""
    rng = np.random.default_rng(seed)
    next_id = system_blocks
    recs = []
    for _ in range(n_conv):
        ids = list(range(system_blocks))
        t = float(rng.uniform(0, 2.0))
        for _ in range(turns):
            new = int(rng.integers(1, 4))
            ids = ids + list(range(next_id, next_id + new))
            next_id += new
            isl = len(ids) * 512 - int(rng.integers(0, 400))
            osl = int(rng.integers(*out_range))
            recs.append({"timestamp": int(t * 1e3), "input_length": isl, "output_length": osl, "hash_ids": list(ids)})
            t += gap_s * float(rng.uniform(0.5, 1.5)) * n_conv / 4
    recs.sort(key=lambda r: r["timestamp"])
    return recs


def write_jsonl(path: Path, recs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def shared_prefix_tokens(recs: list[dict]) -> list[int]:
    """For each record (arrival order), the longest prefix, in tokens, that it shares with an
    earlier record (common leading hash ids, capped by both lengths)."""
    out = []
    for i, r in enumerate(recs):
        best = 0
        for q in recs[:i]:
            n = 0
            for a, b in zip(r["hash_ids"], q["hash_ids"], strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, min(n * 512, r["input_length"], q["input_length"]))
        out.append(best)
    return out
