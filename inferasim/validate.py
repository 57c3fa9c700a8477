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

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from inferasim.anchor_rules import AnchorChoice, anchor_gpu_time_share, check_rule, select_anchors
from inferasim.core.runs import (
    HIDDEN_COLUMNS,
    MODES,
    BenchRow,
    KernelKey,
    Layout,
    RowPrediction,
    Unreadable,
    filter_rows,
    is_target,
)
from inferasim.errors import CannotPredict

__all__ = [
    "METRICS",
    "SPLIT_KEYS",
    "FittedKernel",
    "Predictor",
    "RowResult",
    "ValidationResult",
    "metric_values",
    "ranking_fidelity",
    "row_reach",
    "run_validation",
    "throughput_per_gpu",
]


METRICS = ("tpot", "ttft", "throughput_per_gpu", "batch_latency")
# Split key -> the BenchRow field it groups by; "reach" is derived (see row_reach).
SPLIT_KEYS: dict[str, str] = {"engine": "backend", "gpu": "system", "model": "model_path", "reach": ""}
# How far a scored row lies from its kernel set's anchor: what the prediction had to carry.
# Every row at the anchor's layout and length pair is itself anchor, so concurrency alone never
# separates a scored row from its anchor: a scored row reaches "anchor" only where a predictor
# prices it as the anchor's own deployment although its columns are written otherwise
# (`Predictor.deployment`).
REACH_ANCHOR = "anchor"
REACH_LENGTHS = "lengths"  # anchor layout, another (isl, osl)
REACH_LAYOUT = "layout"  # another layout, the anchor's (isl, osl)
REACH_BOTH = "layout+lengths"
REACH_DISAGG = "disagg"  # disaggregated pools, carried from the aggregated anchor
REACH_NONE = "no anchor"

class FittedKernel(Protocol):
    def predict(self, row: BenchRow) -> RowPrediction: ...


class Predictor(Protocol):
    """A predictor may also define `deployment(row) -> Hashable`: the deployment it prices for a
    row, when that differs from the row's layout columns as written. The reach split compares
    those (a row written differently but priced as the anchor's own deployment carries no layout)."""

    def fit(self, kernel_key: tuple[str, ...], anchor_rows: list[BenchRow]) -> FittedKernel: ...


Deployment = Callable[[BenchRow], Hashable]


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
    raw = {k: v for k, v in row.raw.items() if k not in HIDDEN_COLUMNS}
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
    measurement_free: bool = False,
) -> ValidationResult:
    """Run the protocol of DESIGN.md section 7 with `predictor` on `rows`. `unreadable`: what a
    lenient load_rows could not read; rows it left out that validate would have scored count as
    unpredicted, with the cell that stopped them as the reason, and every entry is listed.

    `measurement_free`: leave one kernel set out. Every anchor is fitted as the rule selects it,
    the predictor learns their population (`learn_population`), and every row of every kernel set,
    its anchor rows too, is priced from the population without that kernel set (`population`)."""
    check_rule(rule)
    splits = _check_splits(split_by)
    filtered = filter_rows(rows)
    anchors = select_anchors(filtered, rule)
    deployment: Deployment | None = getattr(predictor, "deployment", None)

    fitted: dict[KernelKey, FittedKernel | str] = {}
    # A kernel set with target rows and no anchor of its own (disaggregated rows only) is priced
    # from the population of the anchors this file gives, as predict and tune price a kernel set
    # the store has no anchor for (model.measurement_free); its own rows inform nothing.
    orphans = any(r.kernel_key not in anchors for r in filtered)
    learns = hasattr(predictor, "learn_population") and hasattr(predictor, "population")
    if measurement_free or (orphans and learns):
        for key, anchor in anchors.items():
            try:
                fitted[key] = predictor.fit(key, list(anchor.rows))
            except Exception as exc:  # listed with the unusable anchors below
                fitted[key] = "fit failed: " + _reason(exc)
        predictor.learn_population({k: f for k, f in fitted.items() if not isinstance(f, str)})  # type: ignore[attr-defined]
    anchor_ids = set() if measurement_free else {id(r) for a in anchors.values() for r in a.rows}
    targets = [r for r in filtered if id(r) not in anchor_ids]
    total = len(targets)
    # A kernel set with disaggregated rows only has no aggregated anchor. DESIGN section 7 counts a
    # row unpredicted only where no architecture is known: a predictor that can price one
    # measurement-free (`unanchored(kernel_key, row)`) does, flagged (reach "no anchor").
    price_free: Callable[[KernelKey, BenchRow], FittedKernel] | None = getattr(predictor, "unanchored", None)
    free: dict[KernelKey, FittedKernel | str] = {}
    no_anchor = "no aggregated anchor for this kernel set (no agg row of the same backend, version, model, system " \
                "and precision)"
    results: list[RowResult] = []
    if measurement_free or (orphans and learns):
        price_free = predictor.population  # type: ignore[attr-defined]
    for done, row in enumerate(targets, start=1):
        key = row.kernel_key
        anchor = None if measurement_free else anchors.get(key)
        if anchor is None:
            measured = metric_values(row, row.ttft_ms, row.tpot_ms, row.batch_latency_s, row.throughput_tok_s)
            if price_free is not None and key not in free:
                try:
                    free[key] = price_free(key, row)
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
    n_anchor = 0 if measurement_free else sum(len(a.rows) for a in anchors.values())
    excluded = {
        "excluded_engine": sum(1 for r in rows if r.mode in MODES and not is_target(r)),
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
