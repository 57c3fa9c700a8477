"""The validation protocol of DESIGN.md section 7.

Read a CSV of measured serving runs, keep the ``agg`` and ``disagg`` rows of the target engines,
pick one anchor per kernel set with the ``min-gpus`` rule, fit the predictor on the anchor rows
only, predict every other row of the kernel set, and score the predictions: per-metric median and
p90 absolute percentage error (as fractions), ranking fidelity of throughput per GPU within each
(kernel set, isl, osl, concurrency) group, anchor share, and the rows that could not be predicted
with their reason.

The predictor is not part of this module: anything with ``fit(kernel_key, anchor_rows)`` returning
an object with ``predict(row)`` will do (see :class:`Predictor`). This module has no CLI code; the
``inferasim validate`` command calls :func:`load_rows`, :func:`run_validation` and
:func:`write_outputs`.
"""

import csv
import dataclasses
import json
import math
import re
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from inferasim.catalog.engines import UnknownEngineError, normalize_engine

__all__ = [
    "ANCHOR_RULES",
    "METRICS",
    "SPLIT_KEYS",
    "TARGET_ENGINES",
    "AnchorChoice",
    "BenchRow",
    "CannotPredict",
    "FittedKernel",
    "Layout",
    "PoolLayout",
    "Predictor",
    "RowPrediction",
    "RowResult",
    "ValidationResult",
    "filter_rows",
    "load_rows",
    "metric_values",
    "ranking_fidelity",
    "row_reach",
    "run_validation",
    "select_anchors",
    "throughput_per_gpu",
    "write_outputs",
]

KernelKey = tuple[str, str, str, str, str]

TARGET_ENGINES = ("vllm", "sglang", "atom")
ANCHOR_RULES = ("min-gpus", "harvest")
# What `inferasim harvest run` measures by default (harvest.plan): the short pair at these client
# counts, the long prompt at one. The harvest anchor rule takes the rows nearest to it.
HARVEST_SHORT = (512, 128)
HARVEST_CONCURRENCIES = (1, 4, 16, 64)
HARVEST_LONG_CONCURRENCY = 8
MODES = ("agg", "disagg")
SCENARIOS = ("closed", "offline")
METRICS = ("tpot", "ttft", "throughput_per_gpu", "batch_latency")
# Split key -> the BenchRow field it groups by; "reach" is derived (see row_reach).
SPLIT_KEYS: dict[str, str] = {"engine": "backend", "gpu": "system", "model": "model_path", "reach": ""}
# How far a scored row lies from its kernel set's anchor: what the prediction had to carry.
# Every row at the anchor's layout and length pair is itself anchor, so concurrency alone never
# separates a scored row from its anchor: a scored row reaches "anchor" only where the predictor
# prices it as the anchor's own deployment although its columns are written otherwise (the
# squared-width rows of predictor.engine_layout: the same deployment, measured again).
REACH_ANCHOR = "anchor"
REACH_LENGTHS = "lengths"  # anchor layout, another (isl, osl)
REACH_LAYOUT = "layout"  # another layout, the anchor's (isl, osl)
REACH_BOTH = "layout+lengths"
REACH_DISAGG = "disagg"  # disaggregated pools, carried from the aggregated anchor
REACH_NONE = "no anchor"

REQUIRED_COLUMNS = (
    "backend",
    "backend_version",
    "model_path",
    "system",
    "precision",
    "mode",
    "isl",
    "osl",
    "batch_size",
    "tp_size",
)
LAYOUT_COLUMNS = ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")
# measured columns, first present wins; these are hidden from the predictor's `predict` input
MEASURED_COLUMNS: dict[str, tuple[str, ...]] = {
    "ttft_ms": ("silicon_ttft_ms", "ttft_ms"),
    "tpot_ms": ("silicon_tpot_ms", "tpot_ms"),
    "batch_latency_s": ("batch_latency_s",),
    "throughput_tok_s": ("throughput_tok_s",),
}
_HIDDEN_COLUMNS = frozenset(c for cols in MEASURED_COLUMNS.values() for c in cols)
_CONCURRENCY_IN_SOURCE = re.compile(r"silicon_concurrency\s*=\s*(\d+)")


# --------------------------------------------------------------------------------------------
# the predictor interface


class CannotPredict(Exception):
    """Raised by a predictor (fit or predict) with a human-readable reason."""


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    moe_tp: int = 1
    moe_ep: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def as_tuple(self) -> tuple[int, int, int, int, int]:
        return (self.tp, self.pp, self.dp, self.moe_tp, self.moe_ep)

    def __str__(self) -> str:
        return f"tp{self.tp}.pp{self.pp}.dp{self.dp}.moe_tp{self.moe_tp}.moe_ep{self.moe_ep}"


@dataclass(frozen=True)
class PoolLayout:
    """One pool (prefill or decode) of a disaggregated row."""

    workers: int
    layout: Layout
    batch_size: int | None

    @property
    def gpus(self) -> int:
        return self.workers * self.layout.gpus

    def __str__(self) -> str:
        return f"{self.workers}x{self.layout}"


@dataclass(frozen=True)
class BenchRow:
    id: str
    backend: str
    backend_version: str
    model_path: str
    system: str
    precision: str
    mode: str
    scenario: str
    isl: int
    osl: int
    concurrency: int
    layout: Layout
    prefill: PoolLayout | None
    decode: PoolLayout | None
    ttft_ms: float | None
    tpot_ms: float | None
    batch_latency_s: float | None
    throughput_tok_s: float | None
    raw: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def kernel_key(self) -> KernelKey:
        return (self.backend, self.backend_version, self.model_path, self.system, self.precision)

    @property
    def gpus(self) -> int:
        if self.mode == "disagg" and (self.prefill is not None or self.decode is not None):
            return sum(p.gpus for p in (self.prefill, self.decode) if p is not None)
        return self.layout.gpus


@dataclass(frozen=True)
class RowPrediction:
    ttft_ms: float | None
    tpot_ms: float | None
    batch_latency_s: float | None = None
    throughput_tok_s: float | None = None
    interval: dict[str, tuple[float, float]] = field(default_factory=dict)
    extrapolated: bool = False
    anchor: str = ""


class FittedKernel(Protocol):
    def predict(self, row: BenchRow) -> RowPrediction: ...


class Predictor(Protocol):
    """A predictor may also define `deployment(row) -> Hashable`: the deployment it prices for a
    row, when that differs from the row's layout columns as written. The reach split compares
    those (a row written differently but priced as the anchor's own deployment carries no layout)."""

    def fit(self, kernel_key: tuple[str, ...], anchor_rows: list[BenchRow]) -> FittedKernel: ...


Deployment = Callable[[BenchRow], Hashable]


# --------------------------------------------------------------------------------------------
# loading


class CellError(ValueError):
    """A cell load_rows cannot read: the message names the file, row, line, column and what is
    accepted; the fields let a lenient reader list it."""

    def __init__(self, message: str, column: str, value: str) -> None:
        super().__init__(message)
        self.column = column
        self.value = value


@dataclass(frozen=True)
class Unreadable:
    """A cell load_rows could not read in lenient mode: its row left out (`kept` False: a field the
    row cannot be placed without) or kept without that measurement (`kept` True)."""

    id: str
    line: int
    column: str
    value: str
    reason: str
    kept: bool
    target: bool  # the row is one validate scores (agg/disagg of vllm, sglang or atom)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "line": self.line, "column": self.column, "value": self.value,
                "reason": self.reason, "row": "scored without this value" if self.kept else "left out"}


def _cell(raw: dict[str, str], col: str) -> str:
    value = raw.get(col)
    return "" if value is None else value.strip()


class _RowReader:
    def __init__(self, path: Path, rownum: int, line: int, raw: dict[str, str],
                 skipped: list[Unreadable] | None = None) -> None:
        self.path = path
        self.rownum = rownum
        self.line = line
        self.raw = raw
        # Lenient mode (a list): a measured cell it cannot read is listed here and the row kept.
        self.skipped = skipped

    def error(self, col: str, value: str, accepted: str) -> CellError:
        return CellError(
            f"{self.path}: row {self.rownum} (line {self.line}), column '{col}': "
            f"cannot read {value!r}; accepted: {accepted}",
            col, value,
        )

    def unreadable(self, exc: CellError, kept: bool) -> Unreadable:
        return Unreadable(id=_cell(self.raw, "id") or str(self.rownum), line=self.line, column=exc.column,
                          value=exc.value, reason=str(exc), kept=kept, target=_raw_is_target(self.raw))

    def integer(self, col: str, *, empty: int | None, minimum: int, accepted: str) -> int | None:
        text = _cell(self.raw, col)
        if text == "":
            return empty
        try:
            number = float(text)
        except ValueError:
            raise self.error(col, text, accepted) from None
        if not math.isfinite(number) or number != int(number) or number < minimum:
            raise self.error(col, text, accepted)
        return int(number)

    def layout_field(self, col: str) -> int:
        # The public data writes 0 for an unused attention-dp or MoE dimension; a deployment has
        # at least one tensor- and one pipeline-parallel rank, so 0 there is an error, not a 1.
        if col.endswith(("tp_size", "pp_size")) and not col.endswith("moe_tp_size"):
            return self.integer(col, empty=1, minimum=1, accepted="a positive integer (empty reads as 1)") or 1
        accepted = "a non-negative integer (0 or empty reads as 1)"
        value = self.integer(col, empty=1, minimum=0, accepted=accepted)
        return 1 if not value else value

    def measured(self, cols: Iterable[str]) -> float | None:
        for col in cols:
            text = _cell(self.raw, col)
            if text == "":
                continue
            accepted = "a positive number, or empty (or NaN) when not measured"
            try:
                number = float(text)
            except ValueError:
                number = math.inf  # refused below, with the cell as written
            if math.isnan(number):
                return None  # NaN is how data frames write a missing value
            if number <= 0 or math.isinf(number):
                exc = self.error(col, text, accepted)
                if self.skipped is None:
                    raise exc
                self.skipped.append(self.unreadable(exc, kept=True))
                return None
            return number
        return None


def recorded_clients(row: BenchRow) -> int | None:
    """The client count a row's `silicon_data_source` records ("silicon_concurrency=N"), if any."""
    found = _CONCURRENCY_IN_SOURCE.search(_cell(row.raw, "silicon_data_source"))
    return int(found.group(1)) if found and int(found.group(1)) > 0 else None


def _pool(reader: _RowReader, prefix: str) -> PoolLayout | None:
    cols = [f"{prefix}_{c}" for c in ("num_workers", "batch_size", *LAYOUT_COLUMNS)]
    if all(_cell(reader.raw, c) == "" for c in cols):
        return None
    workers = reader.integer(
        f"{prefix}_num_workers", empty=1, minimum=1, accepted="a positive integer (empty reads as 1)"
    )
    layout = Layout(*(reader.layout_field(f"{prefix}_{c}") for c in LAYOUT_COLUMNS))
    batch = reader.integer(
        f"{prefix}_batch_size", empty=None, minimum=1, accepted="a positive integer or empty"
    )
    return PoolLayout(workers=workers or 1, layout=layout, batch_size=batch)


def _concurrency(reader: _RowReader, mode: str) -> int:
    value = reader.integer("batch_size", empty=None, minimum=1, accepted="a positive integer")
    if value is not None:
        return value
    # disaggregated silicon rows leave batch_size empty and record the client concurrency in the
    # data-source note ("silicon_concurrency=N")
    found = _CONCURRENCY_IN_SOURCE.search(_cell(reader.raw, "silicon_data_source"))
    if found and int(found.group(1)) > 0:
        return int(found.group(1))
    if mode == "disagg":
        return 0  # reported as unpredicted by run_validation
    raise reader.error(
        "batch_size", "", "a positive integer (the client concurrency; empty only for disagg rows)"
    )


def _parse_row(reader: _RowReader) -> BenchRow:
    raw = reader.raw
    mode = _mode(_cell(raw, "mode"))
    scenario = _cell(raw, "scenario").lower().replace("_", "-").removesuffix("-loop") or "closed"
    # A serving benchmark ("online", "serving") in this schema is a closed loop: the row gives its
    # clients (batch_size), and there is no column for an arrival rate.
    scenario = {"online": "closed", "serving": "closed"}.get(scenario, scenario)
    if scenario not in SCENARIOS:
        raise reader.error("scenario", _cell(raw, "scenario"), f"one of {', '.join(SCENARIOS)} (empty reads as "
                           "closed)")
    isl = reader.integer("isl", empty=None, minimum=1, accepted="a positive integer")
    osl = reader.integer("osl", empty=None, minimum=1, accepted="a positive integer")
    if isl is None:
        raise reader.error("isl", "", "a positive integer")
    if osl is None:
        raise reader.error("osl", "", "a positive integer")
    disagg = mode == "disagg"
    return BenchRow(
        id=_cell(raw, "id") or str(reader.rownum),
        backend=raw.get("backend") or "",
        backend_version=raw.get("backend_version") or "",
        model_path=raw.get("model_path") or "",
        system=raw.get("system") or "",
        precision=raw.get("precision") or "",
        mode=mode,
        scenario=scenario,
        isl=isl,
        osl=osl,
        concurrency=_concurrency(reader, mode),
        layout=Layout(*(reader.layout_field(c) for c in LAYOUT_COLUMNS)),
        prefill=_pool(reader, "prefill") if disagg else None,
        decode=_pool(reader, "decode") if disagg else None,
        ttft_ms=reader.measured(MEASURED_COLUMNS["ttft_ms"]),
        tpot_ms=reader.measured(MEASURED_COLUMNS["tpot_ms"]),
        batch_latency_s=reader.measured(MEASURED_COLUMNS["batch_latency_s"]),
        throughput_tok_s=reader.measured(MEASURED_COLUMNS["throughput_tok_s"]),
        raw=raw,
    )


def _raw_is_target(raw: dict[str, str]) -> bool:
    return _mode(_cell(raw, "mode")) in MODES and _target_engine(_cell(raw, "backend"))


def _mode(text: str) -> str:
    mode = text.strip().lower()
    return {"aggregated": "agg", "disaggregated": "disagg"}.get(mode, mode)


def load_rows(path: str | Path, notes: list[str] | None = None,
              unreadable: list[Unreadable] | None = None) -> list[BenchRow]:
    """Read a CSV of measured runs (schema of shared/data/aic-silicon/silicon_dev.csv).

    Raises ValueError naming the file, the row and the column on anything it cannot read, and
    when no measured column is there at all; appends to `notes` a line per measured metric whose
    column is absent (that metric is not scored). Given an `unreadable` list, a cell it cannot
    read is listed there instead: a row without a readable isl, osl, concurrency, layout or
    scenario is left out, one with an unreadable measurement is kept without it. A file it cannot
    read as a whole (no header, a missing column, not CSV) raises either way.
    """
    path = Path(path)
    try:
        handle = path.open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise ValueError(f"{path}: cannot open: {exc.strerror or exc}") from None
    rows: list[BenchRow] = []
    with handle:
        try:
            reader = csv.DictReader(handle)
            header = [h.strip() for h in (reader.fieldnames or [])]
            if not header:
                raise ValueError(
                    f"{path}: empty file, expected a CSV header with columns {', '.join(REQUIRED_COLUMNS)}"
                )
            reader.fieldnames = header
            missing = [c for c in REQUIRED_COLUMNS if c not in header]
            if missing:
                # One column holding several names: the file is separated by something else than commas.
                other = next((sep for sep in (";", "\t", "|") if len(header) == 1 and sep in header[0]), None)
                hint = f" (the header is one column holding {other!r}: write the file comma-separated)" if other else ""
                raise ValueError(
                    f"{path}: missing required column(s) {', '.join(repr(c) for c in missing)}; "
                    f"required columns are {', '.join(REQUIRED_COLUMNS)}{hint}"
                )
            absent = {metric: cols for metric, cols in MEASURED_COLUMNS.items() if not any(c in header for c in cols)}
            if len(absent) == len(MEASURED_COLUMNS):
                raise ValueError(
                    f"{path}: no measured column: give at least one of "
                    + ", ".join(" or ".join(cols) for cols in MEASURED_COLUMNS.values())
                )
            if notes is not None:
                for metric, cols in absent.items():
                    if metric in ("ttft_ms", "tpot_ms"):  # the other two are for offline rows only
                        notes.append(f"{path}: no column {' or '.join(cols)}: {metric.removesuffix('_ms').upper()} "
                                     "is not scored")
            for rownum, record in enumerate(reader, start=1):
                if None in record.values() or None in record:  # fewer or more cells than the header names
                    cells = sum(v is not None for k, v in record.items() if k is not None) + len(record.get(None) or [])
                    raise ValueError(f"{path}: row {rownum} (line {reader.line_num}) has {cells} cells where the "
                                     f"header names {len(header)} columns")
                raw = dict(record)  # every cell present: the count was checked above
                row_reader = _RowReader(path, rownum, reader.line_num, raw, unreadable)
                try:
                    rows.append(_parse_row(row_reader))
                except CellError as exc:
                    if unreadable is None:
                        raise
                    unreadable.append(row_reader.unreadable(exc, kept=False))
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text ({exc.reason})") from None
        except csv.Error as exc:
            raise ValueError(f"{path}: malformed CSV: {exc}") from None
    return rows


# --------------------------------------------------------------------------------------------
# filter and anchors


@dataclass(frozen=True)
class AnchorChoice:
    layout: Layout
    isl: int
    osl: int
    rows: list[BenchRow]

    def describe(self) -> str:
        pairs = sorted({(r.isl, r.osl) for r in self.rows} - {(self.isl, self.osl)})
        more = "".join(f"+{i}x{o}" for i, o in pairs)
        return f"{self.layout}@{self.isl}x{self.osl}{more}"


def _target_engine(backend: str) -> bool:
    """vLLM, SGLang or ATOM under any of their names (vllm-rocm, sglang-rocm, atom-dev ...); the
    kernel set still keys on the backend as written."""
    try:
        return normalize_engine(backend) in TARGET_ENGINES
    except UnknownEngineError:
        return False


def _is_target(row: BenchRow) -> bool:
    return row.mode in MODES and _target_engine(row.backend)


def filter_rows(rows: Sequence[BenchRow]) -> list[BenchRow]:
    """Rows that take part in validation: mode agg or disagg, engine vllm, sglang or atom."""
    return [r for r in rows if _is_target(r)]


def _check_rule(rule: str) -> None:
    if rule not in ANCHOR_RULES:
        raise ValueError(f"unknown anchor rule {rule!r}; accepted: {', '.join(ANCHOR_RULES)}")


def _anchor_layout(rows: list[BenchRow]) -> tuple[Layout, list[BenchRow]]:
    """The fewest-GPU layout (tie: most rows, then smallest tp, then the smallest layout tuple)."""
    by_layout: dict[Layout, list[BenchRow]] = defaultdict(list)
    for r in rows:
        by_layout[r.layout].append(r)
    layout = min(by_layout, key=lambda lo: (lo.gpus, -len(by_layout[lo]), lo.tp, lo.as_tuple()))
    return layout, by_layout[layout]


def _choose_anchor(rows: list[BenchRow]) -> AnchorChoice:
    layout, at_layout = _anchor_layout(rows)
    isl, osl = min({(r.isl, r.osl) for r in at_layout}, key=lambda p: (p[0] + p[1], p[0]))
    chosen = [r for r in at_layout if r.isl == isl and r.osl == osl]
    return AnchorChoice(layout=layout, isl=isl, osl=osl, rows=chosen)


def _log_distance(a: float, b: float) -> float:
    return abs(math.log(a / b))


def _choose_harvest_anchor(rows: list[BenchRow]) -> AnchorChoice:
    """DESIGN section 7, rule `harvest`: at the min-gpus layout, the length pair nearest the harvest
    plan's short pair at up to four concurrencies (each of 1, 4, 16, 64 in turn takes the nearest
    unused one in log scale; tie: the smaller), plus the longest prompt at the concurrency nearest 8
    (its output length nearest the plan's 64) unless already in. Every row at a chosen (length
    pair, concurrency) is anchor, duplicates included, as under min-gpus."""
    layout, at_layout = _anchor_layout(rows)
    s_isl, s_osl = HARVEST_SHORT
    isl, osl = min({(r.isl, r.osl) for r in at_layout},
                   key=lambda p: (_log_distance(p[0], s_isl) + _log_distance(p[1], s_osl), p[0] + p[1], p[0]))
    pair = [r for r in at_layout if r.isl == isl and r.osl == osl]
    left = sorted({r.concurrency for r in pair})
    taken: list[int] = []
    for want in HARVEST_CONCURRENCIES:
        if not left:
            break
        pick = min(left, key=lambda c: (_log_distance(c, want), c))
        taken.append(pick)
        left.remove(pick)
    chosen = [r for r in pair if r.concurrency in taken]
    long_isl = max(r.isl for r in at_layout)
    longest = [r for r in at_layout if r.isl == long_isl]
    conc = min({r.concurrency for r in longest},
               key=lambda c: (_log_distance(c, HARVEST_LONG_CONCURRENCY), c))
    at_conc = [r for r in longest if r.concurrency == conc]
    long_osl = min({r.osl for r in at_conc}, key=lambda o: (_log_distance(o, 64), o))
    ids = {id(r) for r in chosen}
    chosen += [r for r in at_conc if r.osl == long_osl and id(r) not in ids]
    return AnchorChoice(layout=layout, isl=isl, osl=osl, rows=chosen)


def select_anchors(rows: Sequence[BenchRow], rule: str = "min-gpus") -> dict[KernelKey, AnchorChoice]:
    """One anchor per kernel set, formed among the filtered agg rows."""
    _check_rule(rule)
    by_kernel: dict[KernelKey, list[BenchRow]] = defaultdict(list)
    for r in rows:
        if _is_target(r) and r.mode == "agg":
            by_kernel[r.kernel_key].append(r)
    choose = _choose_harvest_anchor if rule == "harvest" else _choose_anchor
    return {key: choose(members) for key, members in by_kernel.items()}


def gpu_seconds(row: BenchRow) -> float | None:
    """GPU time a row's measurement cost (DESIGN section 7, anchor cost): GPUs x batch latency for an
    offline batch, GPUs x one request cycle (TTFT + (osl - 1) x TPOT) for a closed loop; None
    without the measurement."""
    if row.scenario == "offline":
        return row.gpus * row.batch_latency_s if row.batch_latency_s else None
    if row.ttft_ms is None or row.tpot_ms is None:
        return None
    return row.gpus * (row.ttft_ms + (row.osl - 1) * row.tpot_ms) / 1000.0


def anchor_gpu_time_share(rows: Sequence[BenchRow], anchor_ids: set[int]) -> float | None:
    """The anchors' share of the measured GPU time of `rows` (rows without a measured cost left out):
    how the InferaSim paper states its 4.5% of GPU-hours."""
    cost = [(id(r) in anchor_ids, gpu_seconds(r)) for r in rows]
    total = sum(c for _, c in cost if c)
    return sum(c for a, c in cost if a and c) / total if total else None


# --------------------------------------------------------------------------------------------
# metrics


def _finite(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def throughput_per_gpu(
    row: BenchRow, ttft_ms: float | None, tpot_ms: float | None, throughput_tok_s: float | None = None
) -> float | None:
    """Output tokens per second per GPU.

    Closed rows: concurrency * 1000 / (TTFT + (osl - 1) * TPOT) * osl / GPUs.
    Offline rows: throughput_tok_s / GPUs.
    """
    gpus = row.gpus
    if gpus <= 0:
        return None
    if row.scenario == "offline":
        return None if throughput_tok_s is None else throughput_tok_s / gpus
    if ttft_ms is None or tpot_ms is None or row.concurrency <= 0:
        return None
    latency_ms = ttft_ms + (row.osl - 1) * tpot_ms
    if not latency_ms > 0:
        return None
    return row.concurrency * 1000.0 / latency_ms * row.osl / gpus


def metric_values(
    row: BenchRow,
    ttft_ms: float | None,
    tpot_ms: float | None,
    batch_latency_s: float | None,
    throughput_tok_s: float | None,
) -> dict[str, float | None]:
    """The scored metrics of a row, computed the same way from measured and from predicted values."""
    ttft, tpot = _finite(ttft_ms), _finite(tpot_ms)
    offline = row.scenario == "offline"
    return {
        "ttft": ttft,
        "tpot": tpot,
        "throughput_per_gpu": throughput_per_gpu(row, ttft, tpot, _finite(throughput_tok_s)),
        "batch_latency": _finite(batch_latency_s) if offline else None,
    }


_INTERVAL_ALIASES = {
    "ttft_ms": "ttft",
    "tpot_ms": "tpot",
    "batch_latency_s": "batch_latency",
}


def _intervals(row: BenchRow, pred: RowPrediction) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    for name, bounds in (pred.interval or {}).items():
        try:
            lo, hi = float(bounds[0]), float(bounds[1])
        except (TypeError, ValueError, IndexError):
            continue
        if name in METRICS:
            out[name] = (lo, hi)
        elif name in _INTERVAL_ALIASES:
            out.setdefault(_INTERVAL_ALIASES[name], (lo, hi))
        elif (name == "throughput_tok_s" or (name == "throughput" and row.scenario == "offline")) and row.gpus > 0:
            # An offline row is scored on its measured tok/s; a closed row's throughput follows
            # from TTFT and TPOT (below), not from the predictor's own band.
            out.setdefault("throughput_per_gpu", (lo / row.gpus, hi / row.gpus))
    # a closed row's throughput falls as TTFT and TPOT grow: derive its interval when not given
    if "throughput_per_gpu" not in out and row.scenario == "closed" and "ttft" in out and "tpot" in out:
        lo_thr = throughput_per_gpu(row, out["ttft"][1], out["tpot"][1])
        hi_thr = throughput_per_gpu(row, out["ttft"][0], out["tpot"][0])
        if lo_thr is not None and hi_thr is not None:
            out["throughput_per_gpu"] = (lo_thr, hi_thr)
    return out


def _ape(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or predicted is None or not measured > 0:
        return None
    return abs(predicted - measured) / measured


# --------------------------------------------------------------------------------------------
# results


@dataclass
class RowResult:
    row: BenchRow
    status: str  # "ok" | "unpredicted" | "unmeasured" (nothing measured to score against)
    reason: str = ""
    measured: dict[str, float | None] = field(default_factory=dict)
    predicted: dict[str, float | None] = field(default_factory=dict)
    interval: dict[str, tuple[float, float]] = field(default_factory=dict)
    extrapolated: bool = False
    anchor: str = ""
    reach: str = ""  # what its prediction carries from the anchor (row_reach)

    def ape(self, metric: str) -> float | None:
        if self.status != "ok":
            return None
        return _ape(self.measured.get(metric), self.predicted.get(metric))


@dataclass
class ValidationResult:
    rule: str
    split_by: tuple[str, ...]
    anchors: dict[KernelKey, AnchorChoice]
    results: list[RowResult]  # one per filtered non-anchor row, in file order
    summary: dict[str, Any]


def _metric_summary(results: Sequence[RowResult], metric: str) -> dict[str, Any]:
    values = [a for a in (r.ape(metric) for r in results) if a is not None]
    if not values:
        return {"median_ape": None, "p90_ape": None, "n": 0}
    arr = np.asarray(values, dtype=float)
    return {
        "median_ape": float(np.median(arr)),
        "p90_ape": float(np.percentile(arr, 90)),
        "n": len(values),
    }


def _metrics_block(results: Sequence[RowResult]) -> dict[str, Any]:
    return {m: _metric_summary(results, m) for m in METRICS}


def interval_coverage(results: Sequence[RowResult]) -> dict[str, dict[str, Any]]:
    """Per metric, the share of scored rows whose measured value lies inside the predicted
    interval: how far an operator can trust the band, not only the point."""
    out: dict[str, dict[str, Any]] = {}
    for m in METRICS:
        hits = n = 0
        for r in results:
            value, band = r.measured.get(m), r.interval.get(m)
            if r.status != "ok" or value is None or band is None or not np.isfinite(value):
                continue
            n += 1
            hits += band[0] <= value <= band[1]
        out[m] = {"share": hits / n if n else None, "n": n}
    return out


def ranking_fidelity(results: Sequence[RowResult]) -> dict[str, Any]:
    """Order fidelity of throughput per GPU within each (kernel set, isl, osl, concurrency) group.

    Scored agg rows with both a measured and a predicted throughput take part (a file that mixes
    scenarios is grouped per scenario too: offline and closed throughputs do not compare). Pairs
    are rows of different layouts; a predicted tie counts one half; a pair whose measured values
    are equal has no order to get right and is left out. Top-1 and regret are over groups with at
    least two distinct layouts; a tie for the predicted best averages over the tied rows.
    """
    groups: dict[tuple[Any, ...], list[tuple[Layout, int, float, float]]] = defaultdict(list)
    for r in results:
        row = r.row
        if r.status != "ok" or row.mode != "agg":
            continue
        meas, pred = r.measured.get("throughput_per_gpu"), r.predicted.get("throughput_per_gpu")
        if meas is None or pred is None or not meas > 0:
            continue
        key = (row.kernel_key, row.scenario, row.isl, row.osl, row.concurrency)
        groups[key].append((row.layout, row.gpus, meas, pred))

    pairs = pairs_eq = 0
    score = score_eq = 0.0
    top1_sum = regret_sum = 0.0
    n_groups = 0
    for members in groups.values():
        n = len(members)
        for i in range(n):
            lay_i, gpu_i, m_i, p_i = members[i]
            for j in range(i + 1, n):
                lay_j, gpu_j, m_j, p_j = members[j]
                if lay_i == lay_j or m_i == m_j:
                    continue
                if p_i == p_j:
                    s = 0.5
                else:
                    s = 1.0 if (p_i > p_j) == (m_i > m_j) else 0.0
                pairs += 1
                score += s
                if gpu_i == gpu_j:
                    pairs_eq += 1
                    score_eq += s
        if len({m[0] for m in members}) < 2:
            continue
        n_groups += 1
        best = max(m[2] for m in members)
        top_pred = max(m[3] for m in members)
        picked = [m[2] for m in members if m[3] == top_pred]
        top1_sum += sum(1.0 for v in picked if v == best) / len(picked)
        regret_sum += sum((best - v) / best for v in picked) / len(picked)

    return {
        "pair_accuracy": score / pairs if pairs else None,
        "pairs": pairs,
        "pair_accuracy_equal_gpus": score_eq / pairs_eq if pairs_eq else None,
        "pairs_equal_gpus": pairs_eq,
        "top1": top1_sum / n_groups if n_groups else None,
        "regret": regret_sum / n_groups if n_groups else None,
        "groups": n_groups,
    }


def _section(
    results: Sequence[RowResult],
    anchor_rows: int,
    filtered: int,
    rows_total: int,
    kernel_sets: int,
    extra_counts: dict[str, int] | None = None,
) -> dict[str, Any]:
    agg = [r for r in results if r.row.mode == "agg"]
    # Disaggregated rows carried from their kernel set's aggregated anchor; those of a kernel set
    # without one, priced measurement-free, are scored apart again ("measurement_free").
    disagg = [r for r in results if r.row.mode == "disagg" and r.reach != REACH_NONE]
    free = [r for r in results if r.row.mode == "disagg" and r.reach == REACH_NONE]
    unpredicted = [r for r in results if r.status == "unpredicted"]
    unmeasured = [r for r in results if r.status == "unmeasured"]
    section: dict[str, Any] = _metrics_block(agg)
    section["ranking"] = ranking_fidelity(agg)
    section["anchor_share"] = anchor_rows / filtered if filtered else None
    section["unpredicted"] = {
        "n": len(unpredicted),
        "rows": [{"id": r.row.id, "reason": r.reason} for r in unpredicted],
    }
    section["unmeasured"] = {"n": len(unmeasured), "rows": [r.row.id for r in unmeasured]}
    counts = {
        "rows": rows_total,
        "filtered": filtered,
        "anchor_rows": anchor_rows,
        "scored_agg": sum(1 for r in agg if r.status == "ok"),
        "scored_disagg": sum(1 for r in disagg if r.status == "ok"),
        "scored_measurement_free": sum(1 for r in free if r.status == "ok"),
        "kernel_sets": kernel_sets,
    }
    counts.update(extra_counts or {})
    section["counts"] = counts
    section["interval_coverage"] = interval_coverage(agg)
    section["disagg"] = _metrics_block(disagg)
    section["measurement_free"] = _metrics_block(free)
    return section


# --------------------------------------------------------------------------------------------
# the protocol


def _hide_measurements(row: BenchRow) -> BenchRow:
    raw = {k: v for k, v in row.raw.items() if k not in _HIDDEN_COLUMNS}
    return dataclasses.replace(
        row, ttft_ms=None, tpot_ms=None, batch_latency_s=None, throughput_tok_s=None, raw=raw
    )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, CannotPredict):
        return str(exc) or "cannot predict"
    return f"predictor error: {type(exc).__name__}: {exc}"


def row_reach(row: BenchRow, anchor: AnchorChoice | None, deployment: Deployment | None = None) -> str:
    """What the prediction of `row` carries from `anchor`: another length pair, another layout,
    both, or a disaggregated deployment (REACH_* values). Layouts are compared as `deployment`
    reads them (the predictor's; default: the layout columns as written)."""
    if anchor is None:
        return REACH_NONE
    if row.mode == "disagg":
        return REACH_DISAGG
    if deployment is not None and anchor.rows:
        other_layout = deployment(row) != deployment(anchor.rows[0])
    else:
        other_layout = row.layout != anchor.layout
    other_lengths = (row.isl, row.osl) != (anchor.isl, anchor.osl)
    if other_layout and other_lengths:
        return REACH_BOTH
    if other_layout:
        return REACH_LAYOUT
    return REACH_LENGTHS if other_lengths else REACH_ANCHOR


def _split_value(split: str, row: BenchRow, anchors: dict[KernelKey, AnchorChoice],
                 deployment: Deployment | None = None) -> str:
    if split == "reach":
        return row_reach(row, anchors.get(row.kernel_key), deployment)
    return str(getattr(row, SPLIT_KEYS[split]))


def _check_splits(split_by: Sequence[str]) -> tuple[str, ...]:
    if isinstance(split_by, str):
        split_by = (split_by,)
    for key in split_by:
        if key not in SPLIT_KEYS:
            raise ValueError(f"unknown split key {key!r}; accepted: {', '.join(SPLIT_KEYS)}")
    return tuple(dict.fromkeys(split_by))


def _predict_row(fitted: FittedKernel, row: BenchRow, anchor: AnchorChoice | None) -> RowResult:
    measured = metric_values(row, row.ttft_ms, row.tpot_ms, row.batch_latency_s, row.throughput_tok_s)
    if row.mode == "disagg" and row.prefill is None and row.decode is None:
        return RowResult(row, "unpredicted", "disagg row without prefill/decode pool layout", measured)
    if row.concurrency <= 0:
        return RowResult(row, "unpredicted", "concurrency unknown (empty batch_size)", measured)
    try:
        pred = fitted.predict(_hide_measurements(row))
    except Exception as exc:  # a row the predictor cannot handle is reported, not fatal
        return RowResult(row, "unpredicted", _reason(exc), measured)
    if not isinstance(pred, RowPrediction):
        return RowResult(row, "unpredicted", f"predictor returned {type(pred).__name__}", measured)
    predicted = metric_values(row, pred.ttft_ms, pred.tpot_ms, pred.batch_latency_s, pred.throughput_tok_s)
    if all(measured[m] is None for m in METRICS):
        # Nothing to score against: the prediction is still written, and the row is counted apart
        # from those the tool could not predict.
        return RowResult(row, "unmeasured", "the row has no measured TTFT, TPOT, batch latency or throughput "
                         "(empty or NaN cells): predicted, not scored", measured, predicted)
    if not any(measured[m] is not None and predicted[m] is not None for m in METRICS):
        have = [m for m in METRICS if measured[m] is not None] or ["none"]
        return RowResult(
            row,
            "unpredicted",
            f"predictor gave no value for the measured metrics ({', '.join(have)})",
            measured,
            predicted,
        )
    return RowResult(
        row,
        "ok",
        "",
        measured,
        predicted,
        _intervals(row, pred),
        bool(pred.extrapolated),
        pred.anchor or (anchor.describe() if anchor is not None else "measurement-free"),
    )


def run_validation(
    rows: Sequence[BenchRow],
    predictor: Predictor,
    rule: str = "min-gpus",
    split_by: Sequence[str] = (),
    progress: Callable[[int, int], None] | None = None,
    unreadable: Sequence[Unreadable] = (),
) -> ValidationResult:
    """Run the protocol of DESIGN.md section 7 with `predictor` on `rows`. `unreadable`: what a
    lenient load_rows could not read; rows it left out that validate would have scored count as
    unpredicted, with the cell that stopped them as the reason, and every entry is listed."""
    _check_rule(rule)
    splits = _check_splits(split_by)
    filtered = filter_rows(rows)
    anchors = select_anchors(filtered, rule)
    anchor_ids = {id(r) for a in anchors.values() for r in a.rows}
    targets = [r for r in filtered if id(r) not in anchor_ids]
    total = len(targets)
    deployment: Deployment | None = getattr(predictor, "deployment", None)

    fitted: dict[KernelKey, FittedKernel | str] = {}
    # A kernel set with disaggregated rows only has no aggregated anchor. DESIGN section 7 counts a
    # row unpredicted only where no architecture is known: a predictor that can price one
    # measurement-free (`unanchored(kernel_key, row)`) does, flagged (reach "no anchor").
    measurement_free: Callable[[KernelKey, BenchRow], FittedKernel] | None = getattr(predictor, "unanchored", None)
    free: dict[KernelKey, FittedKernel | str] = {}
    no_anchor = "no aggregated anchor for this kernel set (no agg row of the same backend, version, model, system " \
                "and precision)"
    results: list[RowResult] = []
    for done, row in enumerate(targets, start=1):
        key = row.kernel_key
        anchor = anchors.get(key)
        if anchor is None:
            measured = metric_values(row, row.ttft_ms, row.tpot_ms, row.batch_latency_s, row.throughput_tok_s)
            if measurement_free is not None and key not in free:
                try:
                    free[key] = measurement_free(key, row)
                except CannotPredict as exc:
                    free[key] = f"{no_anchor}, and none measurement-free: {exc}"
                except Exception as exc:  # a defect of the predictor: counted as unpredicted_errors
                    free[key] = _reason(exc)
            kernel = free.get(key, no_anchor)
            if isinstance(kernel, str):
                results.append(RowResult(row, "unpredicted", kernel, measured))
            else:
                results.append(_predict_row(kernel, row, None))
        else:
            if key not in fitted:
                try:
                    fitted[key] = predictor.fit(key, list(anchor.rows))
                except Exception as exc:  # reported per row
                    fitted[key] = "fit failed: " + _reason(exc)
            kernel = fitted[key]
            if isinstance(kernel, str):
                measured = metric_values(
                    row, row.ttft_ms, row.tpot_ms, row.batch_latency_s, row.throughput_tok_s
                )
                results.append(RowResult(row, "unpredicted", kernel, measured))
            else:
                results.append(_predict_row(kernel, row, anchor))
        results[-1].reach = row_reach(row, anchor, deployment)
        if progress is not None:
            progress(done, total)

    # A kernel set whose only rows are its anchor has nothing to score, and its fit was never
    # tried: an anchor the predictor cannot use (an unknown GPU, model or precision) would
    # otherwise vanish into the anchor share. Fitted here; every anchor whose fit failed is
    # listed (those with scored rows also give the reason on each of them).
    unusable = []
    for key, anchor in anchors.items():
        if key in fitted:
            kernel = fitted[key]
        else:
            try:
                kernel = predictor.fit(key, list(anchor.rows))
            except Exception as exc:  # reported, as a scored row's fit failure is
                kernel = "fit failed: " + _reason(exc)
        if isinstance(kernel, str):
            unusable.append({"kernel_set": ":".join(str(k) for k in key), "anchor": anchor.describe(),
                             "rows": [r.id for r in anchor.rows], "reason": kernel})
    n_anchor = sum(len(a.rows) for a in anchors.values())
    excluded = {
        "excluded_engine": sum(1 for r in rows if r.mode in MODES and not _is_target(r)),
        "excluded_mode": sum(1 for r in rows if r.mode not in MODES),
        "unpredicted_errors": sum(
            1 for r in results if r.reason.startswith(("predictor error", "fit failed: predictor error"))
        ),
    }
    left_out = [u for u in unreadable if not u.kept]
    excluded["unreadable_rows"] = len(left_out)
    summary = _section(results, n_anchor, len(filtered), len(rows) + len(left_out), len(anchors), excluded)
    # A row the file did not let us read is one the tool could not predict: counted, with its cell.
    lost = [{"id": u.id, "reason": f"unreadable: {u.reason}"} for u in left_out if u.target]
    summary["unpredicted"] = {"n": summary["unpredicted"]["n"] + len(lost),
                              "rows": summary["unpredicted"]["rows"] + lost}
    summary["unreadable"] = [u.as_dict() for u in unreadable]
    summary["unusable_anchors"] = unusable
    summary["anchor_gpu_time_share"] = anchor_gpu_time_share(filtered, anchor_ids)
    summary["splits"] = {}
    for split in splits:
        # Each row's group once (a scored row's reach is already on its result).
        group = {id(r): _split_value(split, r, anchors, deployment) for r in filtered if id(r) in anchor_ids}
        group.update((id(r.row), r.reach if split == "reach" else _split_value(split, r.row, anchors))
                     for r in results)
        values = sorted(set(group.values()))
        per_value: dict[str, Any] = {}
        for value in values:
            sub_filtered = [r for r in filtered if group[id(r)] == value]
            sub_results = [r for r in results if group[id(r.row)] == value]
            sub_anchor = sum(1 for r in sub_filtered if id(r) in anchor_ids)
            sub_kernels = len({r.kernel_key for r in sub_filtered if r.kernel_key in anchors})
            per_value[value] = _section(
                sub_results, sub_anchor, len(sub_filtered), len(sub_filtered), sub_kernels
            )
        summary["splits"][split] = per_value
    return ValidationResult(rule=rule, split_by=splits, anchors=anchors, results=results, summary=summary)


# --------------------------------------------------------------------------------------------
# outputs

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
