"""What `inferasim validate` writes: predictions.csv (one record per scored row: measured,
predicted, 90% interval, APE, reach, status) and summary.json (the figures of DESIGN.md section 7)."""

import csv
import json
from pathlib import Path

from inferasim.validate import METRICS, RowResult, ValidationResult

_CSV_HEAD = (
    "id",
    "mode",
    "scenario",
    "backend",
    "backend_version",
    "model_path",
    "system",
    "precision",
    "tp",
    "pp",
    "dp",
    "moe_tp",
    "moe_ep",
    "prefill_pool",
    "decode_pool",
    "gpus",
    "isl",
    "osl",
    "concurrency",
)
_CSV_TAIL = ("extrapolated", "anchor", "reach", "status", "reason")


def _fmt(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _csv_record(r: RowResult, reach: str) -> list[str]:
    row = r.row
    lay = row.layout
    record = [
        row.id,
        row.mode,
        row.scenario,
        *row.kernel_key,
        *(str(v) for v in lay.as_tuple()),
        "" if row.prefill is None else str(row.prefill),
        "" if row.decode is None else str(row.decode),
        str(row.gpus),
        str(row.isl),
        str(row.osl),
        str(row.concurrency),
    ]
    for m in METRICS:
        lo_hi = r.interval.get(m)
        record += [
            _fmt(r.measured.get(m)),
            _fmt(r.predicted.get(m)),
            _fmt(lo_hi[0] if lo_hi else None),
            _fmt(lo_hi[1] if lo_hi else None),
            _fmt(r.ape(m)),
        ]
    record += ["true" if r.extrapolated else "false", r.anchor, reach, r.status, r.reason]
    return record


def write_outputs(result: ValidationResult, out_dir: Path) -> None:
    """Write out_dir/predictions.csv (one line per filtered non-anchor row) and out_dir/summary.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    header = list(_CSV_HEAD)
    for m in METRICS:
        header += [f"{m}_measured", f"{m}_predicted", f"{m}_lo", f"{m}_hi", f"{m}_ape"]
    header += list(_CSV_TAIL)
    with (out_dir / "predictions.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        for r in result.results:
            writer.writerow(_csv_record(r, r.reach))
    (out_dir / "summary.json").write_text(
        json.dumps(result.summary, indent=2, allow_nan=False) + "\n", encoding="utf-8"
    )
