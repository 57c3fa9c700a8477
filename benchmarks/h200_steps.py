"""What isolated H200 step timings say of the step-time model (`make bench` runs it).

The measurements are benchmarks/measured/h200-torchstep-*.json: a PyTorch harness
(inferasim/harvest/torchstep.py) timed decode, prefill and mixed steps of Llama-3-8B,
Llama-2-7B and Qwen3-32B on one H200 at tp 1, and one GPU's slice of the two GQA models at tp 2,
4 and 8 (no all-reduce run). Each check fits the step model (model.stepfit) on some steps and
prints the median |predicted / measured - 1| on steps it did not see:

- random halves: fit on half of a model's tp-1 steps, predict the other half (10 splits);
- harvest-sized: fit on four steps (decode at 1, 16, 64 sequences at 1024 tokens; a 2048-token
  prefill), predict the whole grid;
- layout law: fit all tp-1 steps, predict the tp 2/4/8 slices (collective terms off on both sides);
- model law: fit one model's steps, predict another model's (same harness kernels, other shapes).
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.model.anchors import StepPoint
from inferasim.model.layoutcost import layout_cost
from inferasim.model.stepfit import fit_steps, predict_steps
from inferasim.model.steptime import default_params

HERE = Path(__file__).parent / "measured"
SPLITS = 10


def _points(entry: dict) -> list[StepPoint]:
    return [StepPoint(n_decode=s["n_decode"], decode_context=s["decode_context"],
                      n_prefill_tokens=s["n_prefill_tokens"], prefill_context=s["prefill_context"],
                      step_ms=s["step_ms"], repeats=s["repeats"], std_ms=s["std_ms"]) for s in entry["steps"]]


def _err(pred: np.ndarray, steps: list[StepPoint]) -> np.ndarray:
    return pred / (np.array([s.step_ms for s in steps]) / 1e3) - 1.0


def main() -> int:
    tp1 = json.loads((HERE / "h200-torchstep-tp1.json").read_text())
    slices = json.loads((HERE / "h200-torchstep-tp-slices.json").read_text())
    tps = [e["tp"] for e in json.loads((HERE / "h200-torchstep-tp-slices.plan.json").read_text())["models"]]
    gpu = get_gpu(tp1["gpu"])
    prior = default_params(gpu, "vllm", "")
    print(f"H200 steps ({tp1['device']['device']}, torch {tp1['device']['torch']}, measured {tp1['measured_at']}): "
          "median |pred/meas - 1| on steps the fit did not see")
    fits = {}
    for entry in tp1["models"]:
        spec = get_model(entry["model"])
        cost = layout_cost(spec, gpu, Layout(), "bf16", "auto", "vllm", "")
        steps = _points(entry)
        full = fit_steps(cost, steps, prior)
        fits[entry["model"]] = (full, spec, cost, steps)
        rng = random.Random(0)
        halves = []
        for _ in range(SPLITS):
            idx = list(range(len(steps)))
            rng.shuffle(idx)
            a, b = idx[: len(idx) // 2], idx[len(idx) // 2:]
            f = fit_steps(cost, [steps[i] for i in a], prior)
            held = [steps[i] for i in b]
            halves.append(float(np.median(np.abs(_err(predict_steps(f.params, cost, held), held)))))
        few = [s for s in steps if (not s.n_prefill_tokens and s.decode_context == 1024 and s.n_decode in (1, 16, 64))
               or (not s.n_decode and s.n_prefill_tokens == 2048)]
        fs = fit_steps(cost, few, prior)
        e_few = np.abs(_err(predict_steps(fs.params, cost, steps), steps))
        print(f"  {entry['model']:<28} {len(steps):>2} steps: self-fit {100 * full.median_abs_error:4.1f}%, "
              f"random halves {100 * float(np.median(halves)):4.1f}%, 4 steps -> grid "
              f"{100 * float(np.median(e_few)):4.1f}% (p90 {100 * float(np.percentile(e_few, 90)):4.1f}%)")
    for entry, tp in zip(slices["models"], tps, strict=True):
        full, spec, _, _ = fits[entry["model"]]
        cost = layout_cost(spec, gpu, Layout(tp=tp), "bf16", "auto", "vllm", "")
        steps = _points(entry)
        p = replace(full.params, comm_scale=0.0, t_hop=0.0, t_tp=0.0)
        e = _err(predict_steps(p, cost, steps), steps)
        print(f"  layout law {entry['model']:<28} tp1 -> tp{tp} slice: {100 * float(np.median(np.abs(e))):4.1f}% "
              f"(mean {100 * float(np.mean(e)):+5.1f}%, worst {100 * float(e[np.argmax(np.abs(e))]):+5.1f}%)")
    names = list(fits)
    for a in names:
        row = []
        for b in names:
            if a != b:
                _, _, cost_b, steps_b = fits[b]
                e = _err(predict_steps(fits[a][0].params, cost_b, steps_b), steps_b)
                row.append(f"{b.split('/')[-1]} {100 * float(np.median(np.abs(e))):4.1f}%")
        print(f"  model law {a.split('/')[-1]:<18} -> " + ", ".join(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
