"""The streaming report's quantile sketch: its relative error bound, weights, and merge."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inferasim.sim.report import weighted_percentiles
from inferasim.sim.sketch import ALPHA, QuantileSketch

QS = (1, 10, 50, 90, 99, 100)


def _check(sk: QuantileSketch, v: np.ndarray, w: np.ndarray) -> None:
    got = sk.quantiles(tuple(q / 100 for q in QS))
    for g, ref in zip(got, weighted_percentiles(v, w, QS), strict=True):
        assert abs(g - ref) <= sk.alpha * abs(ref) * (1 + 1e-9), (g, ref)
    assert sk.mean() == pytest.approx(float((v * w).sum() / w.sum()), rel=1e-12)
    assert sk.count == pytest.approx(float(w.sum()))


@pytest.mark.parametrize("seed", range(5))
def test_error_bound_over_many_decades(seed: int) -> None:
    rng = np.random.default_rng(seed)
    v = np.exp(rng.uniform(np.log(1e-6), np.log(1e4), 20000))
    w = rng.integers(1, 50, v.size).astype(float)
    sk = QuantileSketch()
    sk.add_many(v, w)
    _check(sk, v, w)


def test_scalar_and_array_adds_agree_and_zeros_count() -> None:
    rng = np.random.default_rng(7)
    v = np.concatenate([rng.lognormal(-3, 1, 500), np.zeros(30)])
    a, b = QuantileSketch(), QuantileSketch()
    for x in v:
        a.add(float(x))
    b.add_many(v)
    assert a.counts == b.counts and a.zero == b.zero == 30
    assert a.quantiles((0.01, 0.5, 0.99)) == b.quantiles((0.01, 0.5, 0.99))
    _check(a, v, np.ones(v.size))
    assert a.quantiles((0.02,)) == [0.0]  # 30 of 530 values are 0: the 2% quantile is one of them


def test_merge_is_the_sketch_of_the_union() -> None:
    rng = np.random.default_rng(3)
    parts = [rng.gamma(2.0, 0.02, n) for n in (100, 3000, 1)]
    whole = QuantileSketch()
    whole.add_many(np.concatenate(parts))
    merged = QuantileSketch()
    for p in parts:
        s = QuantileSketch()
        s.add_many(p)
        merged.merge(s)
    assert merged.counts == pytest.approx(whole.counts)
    assert merged.quantiles((0.5, 0.9, 0.99)) == whole.quantiles((0.5, 0.9, 0.99))
    v = np.concatenate(parts)
    _check(merged, v, np.ones(v.size))
    with pytest.raises(ValueError):
        merged.merge(QuantileSketch(alpha=0.01))


def test_a_coarse_sketch_is_coarse_and_memory_is_buckets() -> None:
    """The bound is tight enough to matter: at alpha = 10% answers move, but stay within 10%."""
    v = np.linspace(1.0, 2.0, 10001)
    fine, coarse = QuantileSketch(), QuantileSketch(alpha=0.1)
    fine.add_many(v)
    coarse.add_many(v)
    assert len(coarse.counts) <= math.ceil(math.log(2.0) / math.log(1.1 / 0.9)) + 1
    assert len(fine.counts) <= math.ceil(math.log(2.0) / math.log((1 + ALPHA) / (1 - ALPHA))) + 1
    ref = weighted_percentiles(v, np.ones(v.size), (50,))[0]
    assert abs(coarse.quantiles((0.5,))[0] - ref) > ALPHA * ref
    _check(coarse, v, np.ones(v.size))


def test_empty_and_bad_alpha() -> None:
    assert all(math.isnan(x) for x in QuantileSketch().quantiles((0.5,)))
    with pytest.raises(ValueError):
        QuantileSketch(alpha=0.0)
