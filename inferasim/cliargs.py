"""Argument types shared by the `inferasim` subcommands: errors name the option and the value."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from inferasim.anchors import SHIPPED_ANCHORS, AnchorStore
from inferasim.catalog.engines import engine_gpu_error
from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import ModelSpec
from inferasim.layout import Layout

if TYPE_CHECKING:
    from inferasim.predictor import FittedAnchor


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
    from inferasim.catalog.models import normalize_precision

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
    from inferasim.memory import plan_memory
    from inferasim.sim.benchmark import TIGHT_MEMORY_FRACTION

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


def check_anchor_matches(path: str, fitted: FittedAnchor, engine: str, model: str, gpu: str) -> None:
    """ValueError when an --anchor file was measured for another engine, model or GPU than asked."""
    for what, want, got in (("engine", engine, fitted.engine), ("model", model, fitted.model.name),
                            ("gpu", gpu, fitted.gpu.name)):
        if want != got:
            raise ValueError(f"--anchor {path} is for {what} {got}, not --{what} {want}")


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
