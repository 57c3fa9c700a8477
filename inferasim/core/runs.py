"""Measured serving runs: one row of a CSV in the schema of shared/data/aic-silicon/silicon_dev.csv
(`BenchRow`), its layout as written (`Layout`, `PoolLayout`), loading with every unreadable cell
named (`load_rows`), and which rows the protocol of DESIGN.md section 7 scores (`filter_rows`)."""

import csv
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferasim.catalog.engines import UnknownEngineError, normalize_engine
from inferasim.errors import UserError

KernelKey = tuple[str, str, str, str, str]

TARGET_ENGINES = ("vllm", "sglang", "atom")
MODES = ("agg", "disagg")
SCENARIOS = ("closed", "offline")
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
HIDDEN_COLUMNS = frozenset(c for cols in MEASURED_COLUMNS.values() for c in cols)
_CONCURRENCY_IN_SOURCE = re.compile(r"silicon_concurrency\s*=\s*(\d+)")



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


# --------------------------------------------------------------------------------------------
# loading


class CellError(UserError):
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


def _target_engine(backend: str) -> bool:
    """vLLM, SGLang or ATOM under any of their names (vllm-rocm, sglang-rocm, atom-dev ...); the
    kernel set still keys on the backend as written."""
    try:
        return normalize_engine(backend) in TARGET_ENGINES
    except UnknownEngineError:
        return False


def is_target(row: BenchRow) -> bool:
    return row.mode in MODES and _target_engine(row.backend)


def filter_rows(rows: Sequence[BenchRow]) -> list[BenchRow]:
    """Rows that take part in validation: mode agg or disagg, engine vllm, sglang or atom."""
    return [r for r in rows if is_target(r)]
