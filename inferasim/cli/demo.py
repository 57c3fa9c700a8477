"""`inferasim demo`: the main job on the bundled example, then the anchored AMD case."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from inferasim.catalog.engines import ROCM_FORK_TAG
from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.cli.predict import find_or_sibling
from inferasim.cli.tune import cmd_tune
from inferasim.cli.usage import UsageError, anchors_in
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
    from inferasim.model.measurement_free import measurement_free
    from inferasim.model.predictor import benchmark_kv_dtype

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
            fitted = measurement_free(store, "vllm", model, gpu, "fp8", layout, version, benchmark_kv_dtype("fp8"))
            anchored = False
            how = "measurement-free (population prior; no anchor on this die)"
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


def _harvest_commands(data: dict[str, Any]) -> list[str]:
    """`inferasim harvest run` for each anchor the tune result is missing, at its cheapest layout."""
    out = []
    for m in data.get("missing_anchors", []):
        lay = m.get("harvest_layout", {})
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in lay.items() if v != 1)
        out.append(f"inferasim harvest run --endpoint http://ENGINE:8000 --model {m['model']} --gpu {m['gpu']} "
                   f"--engine {m['engine']} --precision {m['precision']} {flags}".rstrip() + " --out anchors/")
    return out


def cmd_demo(args: argparse.Namespace) -> int:
    import importlib.util

    example = Path(__file__).resolve().parents[2] / "examples" / "llama70b-mi355x.yaml"
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {args.out!r}: cannot create the folder ({exc.strerror or exc})") from None
    # The plot needs matplotlib (the `plot` extra); without it the demo still writes the manifest.
    plot = str(out / "pareto.png") if importlib.util.find_spec("matplotlib") else None
    manifest = str(out / "deploy.yaml")
    bench = str(out / "bench-jobs.yaml")  # a benchmark Job per short-listed configuration, to confirm on the cluster
    print(f"inferasim demo: `inferasim tune {example.relative_to(example.parent.parent)} "
          f"{'--plot ' + plot + ' ' if plot else ''}--manifest {manifest} --bench-jobs {bench}`\n")
    ns = argparse.Namespace(spec=str(example), anchors=None, plot=plot, manifest=manifest, name="llm",
                            namespace="default", output="table", propose_endpoint=None, propose_model="default",
                            bench_jobs=bench)
    rc = cmd_tune(ns)
    _demo_amd_cases()
    commands = _harvest_commands(getattr(ns, "result_data", {}))
    if commands:
        print("\nNext: harvest the missing anchors on the cluster's GPUs (an engine serving the model at ENGINE), "
              "then tune again:")
        for c in commands:
            print(f"  {c}")
        print(f"  inferasim tune {example} --plot {plot or 'pareto.png'} --manifest {manifest} --bench-jobs {bench}")
        print("  (or let the operator do it: kubectl apply -f a ServingTuning; see charts/ and README 'The operator')")
    return rc


def add_cli(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`inferasim demo`."""
    p = sub.add_parser("demo", help="run the main job on the bundled example")
    p.add_argument("--out", default="demo-out", help="folder for the Pareto plot, its CSVs and the manifest "
                                                     "(default %(default)s)")
    p.set_defaults(func=cmd_demo)
