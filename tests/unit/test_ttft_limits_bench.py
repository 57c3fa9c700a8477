"""benchmarks/ttft_limits.py: the level oracle, the carried anchor residual, the fit-weight switch."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from inferasim.core.runs import BenchRow, Layout
from inferasim.model import fit
from inferasim.validate import RowResult

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.ttft_limits import (  # noqa: E402
    carried_residual,
    halves_better,
    level_oracle,
    ttft_weight,
    with_residuals,
)


def _result(model: str, conc: int, measured: float, predicted: float) -> RowResult:
    row = BenchRow(id=f"{model}{conc}{measured}", backend="vllm", backend_version="0.19.0", model_path=model,
                   system="b200_sxm", precision="fp8", mode="agg", scenario="closed", isl=1024, osl=1024,
                   concurrency=conc, layout=Layout(tp=2), prefill=None, decode=None, ttft_ms=measured,
                   tpot_ms=10.0, batch_latency_s=None, throughput_tok_s=None)
    return RowResult(row, "ok", measured={"ttft": measured, "tpot": 10.0}, predicted={"ttft": predicted, "tpot": 10.0})


def test_a_kernel_set_off_by_one_factor_is_exact_once_its_level_is_known() -> None:
    rows = [_result("a", c, 100.0 * c, 200.0 * c) for c in (4, 8, 16)] + \
        [_result("b", c, 100.0, 80.0) for c in (4, 8)]
    assert level_oracle(rows) == pytest.approx(0.0, abs=1e-12)
    # Scatter inside a kernel set stays: one row 2x over, one 2x under around its median of 1.
    scattered = [_result("a", 4, 100.0, 200.0), _result("a", 8, 100.0, 100.0), _result("a", 16, 100.0, 50.0)]
    assert level_oracle(scattered) == pytest.approx(0.5)


def test_the_anchor_residual_is_interpolated_in_log_clients_and_held_flat_beyond() -> None:
    res = {4: 0.0, 16: math.log(2.0)}
    assert carried_residual(res, 8) == pytest.approx(math.log(2.0) / 2.0)
    assert carried_residual(res, 64) == pytest.approx(math.log(2.0))
    assert carried_residual(res, 1) == pytest.approx(0.0)


def test_a_residual_that_repeats_in_the_kernel_set_corrects_its_rows() -> None:
    # The anchor measured twice its fitted TTFT at 16 clients; the kernel set's row does too.
    rows = [_result("a", 16, 200.0, 100.0)]
    key = rows[0].row.kernel_key
    assert with_residuals(rows, {key: {16: math.log(2.0)}}, 1.0) == pytest.approx(0.0, abs=1e-12)
    assert with_residuals(rows, {key: {16: math.log(2.0)}}, 0.5) == pytest.approx(1.0 - 2.0 ** -0.5)
    assert with_residuals(rows, {}, 1.0) == pytest.approx(0.5)  # no anchor residual: its own error


def test_halves_count_where_the_other_predictions_are_better() -> None:
    base = [_result(m, 4, 100.0, 150.0) for m in "abcd"]
    better = [_result(m, 4, 100.0, 110.0) for m in "abcd"]
    wins = halves_better(base, better, splits=3)
    assert wins["ttft"] == 6 and wins["tpot"] == 0  # equal TPOT is not better


def test_the_fit_weight_is_restored_even_when_the_run_fails() -> None:
    before = fit.METRIC_WEIGHT["ttft"]
    with pytest.raises(RuntimeError), ttft_weight(before + 2.0):
        assert fit.METRIC_WEIGHT["ttft"] == before + 2.0
        raise RuntimeError("run failed")
    assert fit.METRIC_WEIGHT["ttft"] == before
