"""`inferasim demo`: the main job on the bundled example, then the anchored AMD case."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from inferasim.catalog.engines import ROCM_FORK_TAG
from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.cli.predict import find_or_sibling
from inferasim.cli.tune import cmd_tune
from inferasim.cli.usage import anchors_in
from inferasim.core.layout import Layout
from inferasim.model.anchor_store import NoCompatibleAnchor
from inferasim.model.anchors import KernelSet
from inferasim.output import table

# ---- demo --------------------------------------------------------------------------------------

# The demo's anchored AMD case: Llama-3.1-70B FP8 (AMD's -FP8-KV checkpoint) at tp8, 64 clients of
# 2048-token prompts and answers, on the shipped MI300X anchor of AMD's vLLM 0.10.0 build (its own
# ROCm dev-docker tables), carried to the MI325X (the same die), beside the measurement-free MI355X.
_DEMO_AMD = ("amd/Llama-3.1-70B-Instruct-FP8-KV", "0.10.0" + ROCM_FORK_TAG, 8, 2048, 2048, 64)


def _demo_amd_cases() -> None:
    from inferasim.model.deployment import predict_deployment
    from inferasim.model.predictor import benchmark_kv_dtype, unanchored

    model_id, version, tp, isl, osl, conc = _DEMO_AMD
    model, layout = get_model(model_id), Layout(tp=tp)
    ks = KernelSet(engine="vllm", engine_version=version, model=model_id, gpu="MI300X", precision="",
                   kv_dtype="fp8")
    store = anchors_in(None)
    rows = []
    for gpu_name in ("MI300X", "MI325X", "MI355X"):
        gpu = get_gpu(gpu_name)
        try:
            fitted = find_or_sibling(store, ks.model_copy(update={"gpu": gpu_name}), layout, gpu)
            anchored = True
            how = f"anchored: {fitted.anchor_id}" + (" (carried from the same die)" if fitted.measured_on else "")
        except NoCompatibleAnchor:
            fitted = unanchored("vllm", model, gpu, "fp8", layout, version, benchmark_kv_dtype("fp8"))
            anchored = False
            how = "measurement-free (no anchor on this die)"
        p = predict_deployment(fitted, layout, isl, osl, concurrency=conc, anchored=anchored)
        lo, hi = p.tpot_interval or (math.nan, math.nan)
        t_lo, t_hi = p.ttft_interval or (math.nan, math.nan)
        g_lo, g_hi = (v / p.gpus for v in (p.throughput_interval or (math.nan, math.nan)))
        rows.append((f"{gpu_name} x{tp}", how, f"{p.ttft_ms or math.nan:,.0f} [{t_lo:,.0f}, {t_hi:,.0f}]",
                     f"{p.tpot_ms or math.nan:.1f} [{lo:.1f}, {hi:.1f}]",
                     f"{p.throughput_per_gpu:,.0f} [{g_lo:,.0f}, {g_hi:,.0f}]"))
    print(table(["GPUs", "prediction", "TTFT ms [90%]", "TPOT ms [90%]", "tok/s per GPU [90%]"], rows,
                title=f"\nAnchored on AMD: vLLM {version} {model_id}, tp{tp}, {conc} clients, {isl}x{osl} tokens"))
    print("(the MI300X anchor is fitted from AMD's own published MI300X runs; an MI325X borrows it from the same "
          "die; the MI355X, a CDNA 4 part, has none yet: `inferasim harvest run` measures one)")


def cmd_demo(args: argparse.Namespace) -> int:
    example = Path(__file__).resolve().parents[2] / "examples" / "llama70b-mi355x.yaml"
    print(f"inferasim demo: `inferasim tune {example.relative_to(example.parent.parent)}`\n")
    rc = cmd_tune(argparse.Namespace(spec=str(example), anchors=None, plot=None, manifest=None, name="llm",
                                     namespace="default", output="table", propose_endpoint=None,
                                     propose_model="default"))
    _demo_amd_cases()
    return rc


def add_cli(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`inferasim demo`."""
    p = sub.add_parser("demo", help="run the main job on the bundled example")
    p.set_defaults(func=cmd_demo)
