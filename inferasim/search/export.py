"""CSV exports of a tune result: the Pareto front and the short list, for spreadsheets and notebooks.

`inferasim tune --plot PLOT` writes both beside the plot (PLOT's stem + ".csv" for the front,
"-shortlist.csv" for the short list); `-o json` carries the same numbers. One row per point or
entry, plain columns (no nesting), the units in the column names.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

PARETO_COLUMNS = ("label", "engine", "tokens_per_s_per_user", "throughput_per_gpu", "concurrency")
SHORTLIST_COLUMNS = (
    "rank", "engine", "precision", "shape", "replicas", "gpus", "max_num_seqs", "max_num_batched_tokens",
    "throughput_per_gpu_at_slo", "cost_per_million_tokens", "ttft_ms", "ttft_p90_ms", "tpot_ms", "itl_p90_ms",
    "interval_factor_90", "meets_slo", "checked", "anchor")


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return "" if not math.isfinite(value) else f"{value:.6g}"
    return "" if value is None else value


def _write(columns: tuple[str, ...], rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({c: _cell(row.get(c)) for c in columns})
    return buf.getvalue()


def pareto_csv(data: dict[str, Any]) -> str:
    """The Pareto front of `TuneResult.as_dict()`: one row per point, best interactivity first."""
    return _write(PARETO_COLUMNS, list(data.get("pareto", [])))


def shortlist_csv(data: dict[str, Any]) -> str:
    """The short list of `TuneResult.as_dict()`, best first; the band as its 90% factor (x / factor .. x * factor)."""
    rows = []
    for i, e in enumerate(data.get("shortlist", []), 1):
        p = e.get("predicted", {})
        band = p.get("interval_log")
        rows.append({
            "rank": i, "engine": e.get("engine"), "precision": e.get("precision"), "shape": e.get("shape"),
            "replicas": e.get("replicas"), "gpus": e.get("gpus"), "max_num_seqs": e.get("max_num_seqs"),
            "max_num_batched_tokens": e.get("max_num_batched_tokens"),
            **{k: p.get(k) for k in ("throughput_per_gpu_at_slo", "cost_per_million_tokens", "ttft_ms", "ttft_p90_ms",
                                     "tpot_ms", "itl_p90_ms")},
            "interval_factor_90": math.exp(band) if isinstance(band, int | float) else None,
            "meets_slo": e.get("meets_slo"), "checked": "sim" if p.get("stage") == 2 else "est",
            "anchor": e.get("anchor") or "unanchored"})
    return _write(SHORTLIST_COLUMNS, rows)


def csv_paths(plot: str | Path) -> tuple[Path, Path]:
    """Where the two CSVs go beside a plot file."""
    p = Path(plot)
    return p.with_suffix(".csv"), p.with_name(f"{p.stem}-shortlist.csv")


def write_exports(data: dict[str, Any], plot: str | Path) -> tuple[Path, Path]:
    """Write both CSVs beside `plot`; OSError when the folder is not writable."""
    front, short = csv_paths(plot)
    front.write_text(pareto_csv(data), encoding="utf-8")
    short.write_text(shortlist_csv(data), encoding="utf-8")
    return front, short
