"""What the `inferasim` subcommands share: the usage error (one line, exit 2), the output, layout and
deployment flags, and the checks and notes several commands make before they run."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from inferasim.catalog.engines import ENGINES
from inferasim.catalog.models import ModelSpec, context_error
from inferasim.cli.args import anchor_store
from inferasim.cli.args import positive_int as _positive
from inferasim.core.layout import Layout, LayoutError
from inferasim.core.runs import load_rows
from inferasim.errors import InferasimError
from inferasim.model.anchor_store import AnchorStore
from inferasim.model.anchors import SHIPPED_ANCHORS
from inferasim.output import OUTPUT_FORMATS
from inferasim.sources import SOURCE_RULES, read_as_run


class UsageError(InferasimError):
    """Bad input from the user; printed as one line, exit code 2."""


def add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", choices=OUTPUT_FORMATS, default="table",
                   help="table for people, json or yaml for programs")


def add_layout(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp", type=_positive("tp"), default=1, help="tensor-parallel width")
    p.add_argument("--pp", type=_positive("pp"), default=1, help="pipeline stages")
    p.add_argument("--dp", type=_positive("dp"), default=1, help="attention data-parallel ranks")
    p.add_argument("--ep", type=_positive("ep"), default=1, help="expert-parallel width of MoE layers")


def add_deployment(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="Hugging Face id or config.json path")
    p.add_argument("--gpu", required=True, help="GPU name, e.g. MI355X, h200_sxm, NVIDIA-H200")
    p.add_argument("--engine", required=True, help=f"one of {', '.join(ENGINES)}")


def layout_of(args: argparse.Namespace) -> Layout:
    try:
        return Layout(tp=args.tp, pp=args.pp, dp=args.dp, moe_ep=args.ep)
    except LayoutError as exc:
        raise UsageError(str(exc)) from None


ANCHOR_DIR = SHIPPED_ANCHORS


def anchors_in(folders: Sequence[str] | None, flag: str = "--anchors") -> AnchorStore:
    try:
        return anchor_store(folders, flag)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def usage_check(check: Any, flag: str, path: str) -> None:
    """Run an output-path check, its ValueError as a usage error (exit 2)."""
    try:
        check(flag, path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def refuse_over_context(model: ModelSpec, flag: str, tokens: int | None, consequence: str) -> None:
    """ValueError when `flag` asks for more tokens than the model's context holds."""
    if tokens is not None and model.max_context > 0 and tokens > model.max_context:
        raise ValueError(f"{flag} {tokens} exceeds {model.name}'s context of {model.max_context} tokens "
                         f"(max_position_embeddings): {consequence}; give at most {model.max_context}")


def load_rows_noted(path: str, unreadable: list[Any] | None = None, *, as_written: bool = False,
                     applied: dict[str, int] | None = None) -> list[Any]:
    """core.runs.load_rows, its notes (a measured column absent) on stderr. With an `unreadable`
    list, cells it cannot read are listed there (and counted on stderr) instead of stopping.
    The rows are read as their engine ran them (sources.SOURCE_RULES: how one public file writes its
    layouts) unless `as_written`; `applied` receives how many rows each rule read."""
    notes: list[str] = []
    rows = load_rows(path, notes, unreadable)
    if not as_written:
        counts: dict[str, int] = {}
        rows = read_as_run(rows, applied=counts)
        for rule in SOURCE_RULES:
            if counts.get(rule.name):
                notes.append(f"{path}: source rule {rule.name} read {counts[rule.name]} row(s): {rule.why} "
                             "(--as-written reads them as written)")
        if applied is not None:
            applied.update(counts)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if unreadable:
        out = sum(1 for u in unreadable if not u.kept)
        print(f"note: {path}: {len(unreadable)} cell(s) could not be read ({out} row(s) left out, "
              f"{len(unreadable) - out} scored without the value); summary.json lists each under 'unreadable', "
              f"e.g. {unreadable[0].reason}", file=sys.stderr)
    return rows


def refuse_beyond_context(model: ModelSpec, isl: int, osl: int) -> None:
    error = context_error(model, isl)
    if error:
        raise UsageError(f"--isl {isl}: {error}")
    note = context_error(model, isl, osl)
    if note:
        print(f"note: --isl {isl} --osl {osl}: {note}; an API server refuses such a request (an offline run stops "
              "at the context)", file=sys.stderr)


def progress(done: int, total: int) -> None:
    stage_progress("", done, total, unit=" kernel sets")


def parse_selector(items: Sequence[str]) -> dict[str, str]:
    """--selector k=v[,k=v] (repeatable) -> {k: v}; every command that reads Prometheus reads it so."""
    selector: dict[str, str] = {}
    for item in items:
        for part in item.split(","):
            if "=" not in part or not part.split("=", 1)[0].strip():
                raise UsageError(f"--selector {part!r} must be LABEL=VALUE (several: k=v,k=v)")
            k, v = part.split("=", 1)
            selector[k.strip()] = v.strip()
    return selector


_STAGE_START: dict[str, float] = {}


def stage_progress(stage: str, done: int, total: int, unit: str = "") -> None:
    """A bar on a terminal; piped (a log, CI), one line per stage as it ends, with its time."""
    label = f"{stage:8s} " if stage else ""
    if not sys.stderr.isatty():
        started = _STAGE_START.setdefault(stage, time.perf_counter())
        if done >= total:
            sys.stderr.write(f"{(stage or 'progress')}: {done}/{total}{unit} done in "
                             f"{time.perf_counter() - started:.2f} s\n")
            sys.stderr.flush()
            _STAGE_START.pop(stage, None)
        return
    width = 30
    filled = int(width * done / max(total, 1))
    sys.stderr.write(f"\r{label}[{'#' * filled}{'.' * (width - filled)}] {done}/{total}{unit}")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def check_prometheus_url(url: str) -> None:
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"--prometheus {url!r} is not an http(s) URL (e.g. http://prometheus:9090)")
