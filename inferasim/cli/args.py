"""Argument types shared by the `inferasim` subcommands: errors name the option and the value."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from inferasim.catalog.engines import engine_gpu_error
from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import ModelSpec
from inferasim.catalog.precision import kernel_class, normalize_precision
from inferasim.core.layout import Layout
from inferasim.model.anchor_store import AnchorStore
from inferasim.model.anchors import SHIPPED_ANCHORS
from inferasim.model.memory import kv_dtype_bytes

if TYPE_CHECKING:
    from inferasim.model.predictor import FittedAnchor


def positive_int(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} must be a positive integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"--{name} must be a positive integer, got {value}")
        return value

    return parse


def precision_name(text: str) -> str:
    """--precision: any spelling the catalog knows (nvfp4, w8a8, awq ...), kept as written;
    refused by argparse, before any note or work, when unknown."""
    try:
        normalize_precision(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def positive_float(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} must be a positive number, got {text!r}") from None
        if not value > 0 or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"--{name} must be a positive number, got {text}")
        return value

    return parse


def fraction(name: str, zero: bool = False) -> Callable[[str], float]:
    """A share: within (0, 1], or [0, 1) with `zero` (a share one may give up)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} must be a fraction, got {text!r}") from None
        ok = 0.0 <= value < 1.0 if zero else 0.0 < value <= 1.0
        if not ok:
            span = "[0, 1)" if zero else "(0, 1]"
            raise argparse.ArgumentTypeError(f"--{name} must be within {span}, got {text}")
        return value

    return parse


def anchor_store(folders: Sequence[str | Path] | None, flag: str = "--anchors") -> AnchorStore:
    """The anchor store a command reads: `folders` as given (each must be a folder: a typo is not
    an empty store), else the shipped anchors. Files that cannot be read are named on stderr,
    not skipped silently."""
    if folders:
        for folder in folders:
            if not Path(folder).is_dir():
                raise ValueError(f"{flag} {str(folder)!r} is not a folder of anchor JSON files")
    store = AnchorStore(*([Path(f) for f in folders] if folders else [SHIPPED_ANCHORS]))
    for err in store.errors():
        print(f"note: skipped an unreadable anchor file: {err}", file=sys.stderr)
    return store


def refuse_engine_on_gpu(engine: str, gpu: GPU) -> None:
    """ValueError naming both flags when `engine` does not run on `gpu` (catalog.engines)."""
    why = engine_gpu_error(engine, gpu.vendor, gpu.name)
    if why:
        raise ValueError(f"--engine {engine} --gpu {gpu.name}: {why}")


def refuse_early(model: ModelSpec, gpu: GPU, layout: Layout, engine: str, kv_dtype: str | None) -> None:
    """ValueError for what no anchor changes (the engine on the GPU, a KV dtype nobody knows, a
    layout the engine refuses whatever the memory), checked before the anchor search so that its
    notes do not bury the error."""
    from inferasim.model.memory import layout_problems

    refuse_engine_on_gpu(engine, gpu)
    if kv_dtype:
        kv_dtype_bytes(kv_dtype)
    problems = layout_problems(model, layout, engine)
    if problems:
        raise ValueError(f"{engine} cannot serve {model.name} at {layout.label()}: {'; '.join(problems)}")


def note_checkpoint_precision(engine: str, model: str, precision: str) -> None:
    """A note on stderr when the checkpoint the user named would not run at `precision` (a bf16
    checkpoint priced at fp4): the figures stand for a checkpoint of that format, which `render`
    and `tune` ask for by name before they deploy it."""
    from inferasim.catalog.checkpoints import precision_error

    why = precision_error(engine, model, precision)
    if why:
        print(f"note: {why}. Priced at {precision} as asked, as for a {precision} checkpoint of the same "
              "architecture; render and tune refuse this checkpoint at it", file=sys.stderr)


def note_carried(fitted: FittedAnchor) -> None:
    """A note on stderr when the anchor was measured on a sibling GPU (the same die) and carried to
    the one asked for: its efficiencies, the target's peaks and memory; a harvest there confirms it."""
    if fitted.measured_on:
        measured = fitted.anchor_id.removesuffix(f"@{fitted.measured_on}")  # carry_to_gpu's suffix
        print(f"note: no anchor on {fitted.gpu.name}; the {fitted.measured_on} anchor {measured} "
              f"is carried to it (the same die: its fitted efficiencies and host costs at {fitted.gpu.name}'s "
              "bandwidth, FLOP/s and memory; a wider interval); harvest one on "
              f"{fitted.gpu.name} to confirm", file=sys.stderr)


def note_poor_anchor(fitted: FittedAnchor) -> None:
    """A note on stderr when the anchor a prediction uses fits its own points worse than `harvest run`
    would accept (rms log error above DEFAULT_MAX_RMS_LOG_ERROR): what it predicts carries that
    error, and `anchors check` lists it."""
    from inferasim.harvest.run import DEFAULT_MAX_RMS_LOG_ERROR

    fit = fitted.fit
    if fitted.params.client_cap > 0:
        print(f"note: anchor {fitted.anchor_id} was measured by a client that kept about "
              f"{fitted.params.client_cap:.0f} requests in flight whatever its concurrency (client_cap); predictions "
              "at more clients include the wait at the client; harvest with an unlimited client to measure the "
              "engine alone", file=sys.stderr)
    if fit.rms_log_error <= DEFAULT_MAX_RMS_LOG_ERROR:
        return
    worst = ", ".join(f"{m} {v:.0%}" for m, v in sorted(fit.per_metric_mape.items()) if math.isfinite(v))
    print(f"note: anchor {fitted.anchor_id} fits its own {fit.n_points} point(s) poorly (rms log error "
          f"{fit.rms_log_error:.2f}, above the {DEFAULT_MAX_RMS_LOG_ERROR:g} a harvest accepts"
          + (f"; mean errors {worst}" if worst else "") + "): its predictions carry that error; harvest the kernel "
          "set again", file=sys.stderr)


def note_gpu_precision(gpu: GPU, model: ModelSpec, precision: str) -> None:
    """A note on stderr when the GPU has no tensor cores for the weights' dtype (fp4 on Hopper or
    MI300X, fp8 on A100): such weights run dequantised in 16-bit GEMMs (vLLM's Marlin W4A16/W8A16
    kernels) and are priced at the BF16 rate, and an engine or kernel that needs the native format
    will not load the checkpoint there."""
    from inferasim.model.layoutcost import compute_dtype

    try:  # "auto": the checkpoint's own format
        dtypes = {compute_dtype(precision, part, model) for part in ("attention", "routed_experts")}
    except (KeyError, ValueError):
        return
    missing = sorted(d for d in dtypes if d in ("fp4", "fp8") and d not in gpu.flops)
    if missing:
        kinds = " or ".join(m.upper() for m in missing)
        # The checkpoint's own name for its format (nvfp4) where the precision is that format.
        own = model.checkpoint_format
        try:
            same = normalize_precision(precision) in ("auto", normalize_precision(own))
        except ValueError:
            same = False
        shown = own if same else precision
        print(f"note: {gpu.name} has no {kinds} tensor cores: {shown} weights are priced dequantised into BF16 "
              "GEMMs (vLLM's Marlin kernels); an engine without such a kernel for this checkpoint format will not "
              "load it there", file=sys.stderr)


def check_token_budget(engine: str, gpu: GPU, layout: Layout, max_batched_tokens: int | None,
                       max_num_seqs: int | None) -> None:
    """ValueError when vLLM or ATOM would refuse the step budget at start-up: it must hold one
    token of every running sequence (vLLM SchedulerConfig: max_num_batched_tokens >=
    max_num_seqs). SGLang's chunk size has no such floor."""
    from inferasim.catalog.engines import engine_defaults, normalize_engine

    engine = normalize_engine(engine)
    if max_batched_tokens is None or engine == "sglang":
        return
    seqs = max_num_seqs or engine_defaults(engine, gpu.hbm_bytes, tp=layout.tp, pp=layout.pp,
                                           dp_attention=layout.dp, gpu_name=gpu.name).max_num_seqs
    if max_batched_tokens < seqs:
        raise ValueError(f"--max-batched-tokens {max_batched_tokens} is below max_num_seqs {seqs}: {engine} refuses "
                         "a step budget that cannot hold one token of every running sequence; raise it to at least "
                         f"{seqs} or lower --max-num-seqs")


def note_multi_node(gpu: GPU, layout: Layout) -> None:
    """A note when one replica spans nodes: its collectives cross the NICs (priced so), and
    `render` / `tune --manifest` write it as a LeaderWorkerSet (the LWS controller must run)."""
    if layout.gpus > gpu.gpus_per_node:
        nodes = -(-layout.gpus // gpu.gpus_per_node)
        # A rack-scale NVLink domain (GB200/GB300 NVL72) spans nodes: collectives inside it stay on NVLink.
        domain = gpu.scale_up.domain
        where = (f"collectives stay on {gpu.scale_up.name}, one {domain}-GPU domain" if layout.gpus <= domain else
                 f"collectives beyond {domain} GPUs are priced over {gpu.scale_out.name}")
        print(f"note: {layout.label()} needs {layout.gpus} GPUs, {nodes} nodes of {gpu.gpus_per_node} {gpu.name}: "
              f"{where}; rendered as a LeaderWorkerSet (one pod per node; the cluster needs the LWS controller, "
              "kubernetes-sigs/lws)", file=sys.stderr)


def draw_plot(draw: Callable[[], None], path: str, failures: list[str]) -> bool:
    """Run `draw` (which writes the --plot file `path`) after a command's work is done: a file it
    cannot write (a full disk, an extension matplotlib does not know) is added to `failures`, to
    be reported after the result instead of replacing it. True when the plot was written."""
    try:
        draw()
        return True
    except OSError as exc:
        failures.append(f"--plot {path}: cannot write ({exc.strerror or exc})")
    except ValueError as exc:  # matplotlib: a file extension it cannot write
        failures.append(f"--plot {path}: {exc}")
    return False


def refuse_unservable(model: ModelSpec, gpu: GPU, layout: Layout, engine: str, precision: str,
                      kv_dtype: str, memory_fraction: float | None = None) -> float | None:
    """ValueError when the engine would not start `layout` (tp not dividing the heads, weights
    beyond HBM even at the raised memory fraction benchmarks use; or at `memory_fraction` when one
    is given): it has no performance to predict, simulate or measure. Returns the memory fraction
    the layout needs when the engine's default does not fit and only the raised one does (a note
    on stderr says so), else None."""
    from inferasim.model.memory import plan_memory
    from inferasim.model.steady import TIGHT_MEMORY_FRACTION

    refuse_engine_on_gpu(engine, gpu)
    plan = plan_memory(model, gpu, layout, engine=engine, precision=precision, kv_dtype=kv_dtype,
                       memory_fraction=memory_fraction)
    if plan.feasible:
        return None
    if memory_fraction is not None:
        raise ValueError(f"{engine} cannot serve {model.name} at {layout.label()} on {gpu.name} with memory "
                         f"fraction {memory_fraction:g}: " + "; ".join(plan.reasons))
    tight = plan_memory(model, gpu, layout, engine=engine, precision=precision, kv_dtype=kv_dtype,
                        memory_fraction=TIGHT_MEMORY_FRACTION)
    if not tight.feasible:
        raise ValueError(f"{engine} cannot serve {model.name} at {layout.label()} on {gpu.name}: "
                         + "; ".join(tight.reasons) + " (see `inferasim memory` for the plan)")
    print(f"note: {model.name} at {layout.label()} on {gpu.name} does not fit {engine}'s default memory fraction "
          f"({'; '.join(plan.reasons)}); it needs {TIGHT_MEMORY_FRACTION}, as benchmarks run it (vLLM/ATOM "
          "--gpu-memory-utilization, SGLang --mem-fraction-static)", file=sys.stderr)
    return TIGHT_MEMORY_FRACTION


def check_anchor_matches(path: str, fitted: FittedAnchor, engine: str, model: str, gpu: str,
                         precision: str | None = None, kv_dtype: str | None = None) -> None:
    """ValueError when an --anchor file was measured for another engine, model or GPU than asked,
    or at another weight precision or KV-cache dtype than the flags name (an unset or `auto`
    flag takes the anchor's: the anchor's kernels are what is priced)."""
    for what, want, got in (("engine", engine, fitted.engine), ("model", model, fitted.model.name),
                            ("gpu", gpu, fitted.gpu.name)):
        if want != got:
            raise ValueError(f"--anchor {path} is for {what} {got}, not --{what} {want}")
    if precision and normalize_precision(precision) != "auto":
        if kernel_class(precision) != kernel_class(fitted.precision):
            raise ValueError(f"--anchor {path} was measured at precision {fitted.precision}, not --precision "
                             f"{precision}: drop --precision, or give an anchor measured at {precision}")
    if kv_dtype and kv_dtype.lower() != "auto" and kv_dtype_bytes(kv_dtype) != kv_dtype_bytes(fitted.kv_dtype):
        raise ValueError(f"--anchor {path} was measured with KV cache {fitted.kv_dtype}, not --kv-cache-dtype "
                         f"{kv_dtype}: drop --kv-cache-dtype, or give an anchor measured with it")


def check_output_file(flag: str, path: str) -> None:
    """ValueError naming `flag`, before any long work, unless `path` can be written as a file: not
    a folder, in an existing folder one may write into."""
    if not path:
        raise ValueError(f"{flag} names no file")
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {path} is a folder; give a file name")
    parent = p.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"{flag} {path}: not writable")


# Formats matplotlib writes by file extension (FigureCanvasBase.get_supported_filetypes with the Agg,
# PDF, PS, SVG and PGF backends it ships).
PLOT_FORMATS = ("eps", "jpeg", "jpg", "pdf", "pgf", "png", "ps", "raw", "rgba", "svg", "svgz", "tif", "tiff", "webp")


def check_plot_file(flag: str, path: str) -> None:
    """check_output_file, and an extension matplotlib knows: refused before the work, not after."""
    check_output_file(flag, path)
    ext = Path(path).suffix.lower().lstrip(".")
    if ext not in PLOT_FORMATS:
        raise ValueError(f"{flag} {path}: the file's extension picks the image format; use one of "
                         f"{', '.join('.' + f for f in PLOT_FORMATS)}")


def check_output_folder(flag: str, path: str) -> None:
    """ValueError naming `flag` unless `path` is a folder one may write into, or can be created
    as one (its nearest existing ancestor a writable folder)."""
    if not path:
        raise ValueError(f"{flag} names no folder")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {path} is a file; give a folder")
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{flag} {path}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: cannot write under {probe} (not writable)")
