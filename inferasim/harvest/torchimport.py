"""Turn a PyTorch step harvest (`torchstep.py`'s output) into anchors (`inferasim harvest torch-import`).

One anchor per timed model at tp 1, provenance method "pytorch": the steps as measured, and
parameters whose GPU terms (weight and KV read, GEMM and attention efficiency, weight tile) are
fitted from the steps while the host terms are the named engine's prior (model.stepfit). The
kernel set says what ran: the engine the anchor stands in for, attention backend `torch-sdpa`
and graph mode `cuda-graph`, so that it never silently replaces an anchor of the engine's own
kernels; `predict --anchor FILE` uses it on purpose.

Tensor-parallel slices (plan entries with tp > 1) time one GPU's share without the all-reduces:
they check the layout law (benchmarks/h200_steps.py) but are no anchor of a tp deployment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from inferasim.catalog.engines import normalize_engine
from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.errors import UserError
from inferasim.model.anchors import Anchor, FitReport, KernelSet, LayoutModel, Provenance, StepPoint
from inferasim.model.layoutcost import layout_cost
from inferasim.model.stepfit import StepFit, engine_params_from_steps
from inferasim.model.steptime import STEP_MODEL_REVISION, default_params

RESULT_SCHEMA = "inferasim-torchstep/1"
ATTENTION_BACKEND = "torch-sdpa"
GRAPH_MODE = "cuda-graph"


class TorchResultError(UserError, ValueError):
    """A harvest result file that cannot be read as the harness writes it."""


@dataclass
class Imported:
    anchor: Anchor
    fit: StepFit
    skipped: list[str]  # the harness's own skipped points, for the report


def read_result(path: str | Path) -> dict[str, Any]:
    """The harness's JSON, checked for the fields the import reads (each error names the field)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise TorchResultError(f"{p}: cannot read the harvest result ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise TorchResultError(f"{p}: not JSON ({exc.msg} at line {exc.lineno}); pass the file the harness "
                               "wrote (torchstep.py PLAN OUT)") from None
    if not isinstance(data, dict) or data.get("schema") != RESULT_SCHEMA:
        raise TorchResultError(f"{p}: field 'schema' must be {RESULT_SCHEMA!r} (a torchstep.py result)")
    if not isinstance(data.get("models"), list) or not data["models"]:
        raise TorchResultError(f"{p}: field 'models' must list at least one timed model")
    for i, entry in enumerate(data["models"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("model"), str):
            raise TorchResultError(f"{p}: models[{i}].model must be a model name")
        if not isinstance(entry.get("steps"), list):
            raise TorchResultError(f"{p}: models[{i}].steps must be a list of timed steps")
    return data


def _steps(entry: dict[str, Any], where: str) -> list[StepPoint]:
    out = []
    for j, s in enumerate(entry["steps"]):
        try:
            out.append(StepPoint(n_decode=s["n_decode"], decode_context=s["decode_context"],
                                 n_prefill_tokens=s["n_prefill_tokens"], prefill_context=s.get("prefill_context", 0.0),
                                 step_ms=s["step_ms"], repeats=s.get("repeats", 1), std_ms=s.get("std_ms", 0.0)))
        except KeyError as exc:
            raise TorchResultError(f"{where}.steps[{j}]: missing field {exc.args[0]!r}") from None
        except (TypeError, ValidationError) as exc:
            first = exc.errors()[0] if isinstance(exc, ValidationError) else {"loc": (), "msg": str(exc)}
            field = ".".join(str(x) for x in first["loc"])
            raise TorchResultError(f"{where}.steps[{j}].{field}: {first['msg']}") from None
    return out


def import_result(data: dict[str, Any], engine: str, engine_version: str = "", source: str = "") -> list[Imported]:
    """Anchors of every tp-1 model of a harvest result that timed at least one step."""
    engine = normalize_engine(engine)
    gpu = get_gpu(str(data.get("gpu", "")) or str(data.get("device", {}).get("device", "")))
    device = data.get("device", {})
    ceilings = data.get("ceilings", {})
    out = []
    for i, entry in enumerate(data["models"]):
        if int(entry.get("tp", 1)) != 1 or not entry["steps"]:
            continue
        where = f"models[{i}]"
        model = get_model(entry["model"], allow_path=False)
        steps = _steps(entry, where)
        layout = Layout()
        cost = layout_cost(model, gpu, layout, "bf16", "auto", engine, engine_version)
        params, fit = engine_params_from_steps(cost, steps, default_params(gpu, engine, engine_version))
        wall = sum(float(s.get("wall_s", 0.0)) for s in entry["steps"])
        ceil = ""
        if ceilings:
            ceil = (f"; ceilings measured in the run: copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
                    f"bf16 matmul {ceilings['bf16_matmul_flops'] / 1e12:.0f} TFLOP/s")
        notes = (f"isolated steps of the model's layers with random bf16 weights (inferasim torchstep harness "
                 f"v{device.get('harness_version', '?')}): GPU terms {', '.join(fit.free)} fitted from them; host "
                 f"terms are {engine}'s prior. The harness's fixed GPU time per step (its unfused small kernels) "
                 f"fitted to {fit.params.t_fixed * 1e3:.2f} ms, not used for the engine{ceil}")
        anchor = Anchor(
            kernel_set=KernelSet(engine=engine, engine_version=engine_version, model=model.name, gpu=gpu.name,
                                 precision="bf16", attention_backend=ATTENTION_BACKEND, graph_mode=GRAPH_MODE),
            layout=LayoutModel.from_layout(layout), steps=steps, params=params.as_dict(),
            fit=FitReport(n_points=fit.n_points, rms_log_error=fit.rms_log_error,
                          max_abs_log_error=fit.max_abs_log_error, per_metric={"step": fit.median_abs_error},
                          converged=fit.converged, message="fitted from isolated steps",
                          step_model=STEP_MODEL_REVISION),
            provenance=Provenance(
                method="pytorch", source=source or "torchstep result", measured_at=str(data.get("measured_at", "")),
                engine_image=(f"torch {device.get('torch', '?')} (CUDA {device.get('cuda', '?')}) "
                              f"on {device.get('device', '?')}"),
                measured_by="inferasim harvest torch-import", gpu_seconds=round(wall, 1), notes=notes))
        skipped = [f"{s.get('n_decode')}x{s.get('decode_context')}+{s.get('n_prefill_tokens')}: {s.get('why')}"
                   for s in entry.get("skipped", [])]
        out.append(Imported(anchor=anchor, fit=fit, skipped=skipped))
    if not out:
        raise TorchResultError("the result holds no tp-1 model with timed steps: nothing to import "
                               "(tp slices check the layout law only; see the module's note)")
    return out
