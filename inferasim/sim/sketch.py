"""A mergeable quantile sketch with bounded relative error, for the simulator's streaming report.

Log-bucketed histogram (the DDSketch scheme): a positive value x falls in bucket
k = ceil(log_gamma(x)), gamma = (1 + alpha) / (1 - alpha), i.e. in (gamma^(k-1), gamma^k]; the
bucket answers with 2 gamma^k / (gamma + 1), within a relative `alpha` of every value in it. The
q-quantile is the inverted CDF of the weighted values (the smallest value with at least q of the
weight at or below it, as `report.weighted_percentiles` defines it): bucketing is monotone, so
that value lies in the bucket the sketch finds, and the answer is within `alpha` of it (relative),
clamped to the exact minimum and maximum. Zero and negative values (an instant gap) count in
a bucket of their own that answers 0. Mean, count, min and max are exact.

Memory is the number of distinct buckets: log(max / min) / log(gamma), about 2,000 for alpha =
0.25% over nine decades, whatever the number of values. Two sketches of the same alpha merge by
adding their buckets: the result is the sketch of the union (order does not matter).
"""

from __future__ import annotations

import math

import numpy as np

ALPHA = 0.0025  # the report's bound: 0.25% relative on every percentile


class QuantileSketch:
    """Weighted values in, quantiles within relative `alpha` out."""

    __slots__ = ("alpha", "gamma", "_inv_lg", "counts", "zero", "total", "sum", "min", "max")

    def __init__(self, alpha: float = ALPHA) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
        self.alpha = alpha
        self.gamma = (1.0 + alpha) / (1.0 - alpha)
        self._inv_lg = 1.0 / math.log(self.gamma)
        self.counts: dict[int, float] = {}
        self.zero = 0.0  # weight of values <= 0
        self.total = 0.0
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, x: float, w: float = 1.0) -> None:
        if w <= 0:
            return
        self.total += w
        self.sum += x * w
        if x < self.min:
            self.min = x
        if x > self.max:
            self.max = x
        if x > 0:
            k = math.ceil(math.log(x) * self._inv_lg)
            c = self.counts
            c[k] = c.get(k, 0.0) + w
        else:
            self.zero += w

    def add_many(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Add an array of values (weights: one each when None) in one numpy pass."""
        v = np.asarray(values, dtype=float)
        if v.size == 0:
            return
        w = np.ones(v.size) if weights is None else np.asarray(weights, dtype=float)
        keep = w > 0
        if not keep.all():
            v, w = v[keep], w[keep]
            if v.size == 0:
                return
        self.total += float(w.sum())
        self.sum += float((v * w).sum())
        self.min = min(self.min, float(v.min()))
        self.max = max(self.max, float(v.max()))
        pos = v > 0
        if not pos.all():
            self.zero += float(w[~pos].sum())
            v, w = v[pos], w[pos]
            if v.size == 0:
                return
        keys = np.ceil(np.log(v) * self._inv_lg).astype(np.int64)
        # Keys span log(max / min) / log(gamma) values (a few thousand): a bincount over that span
        # is linear, where np.unique would sort every value.
        lo = int(keys.min())
        sums = np.bincount(keys - lo, weights=w)
        present = np.flatnonzero(sums)
        c = self.counts
        for k, s in zip((present + lo).tolist(), sums[present].tolist(), strict=True):
            c[k] = c.get(k, 0.0) + s

    def merge(self, other: QuantileSketch) -> None:
        """Add `other`'s values to this sketch (same alpha)."""
        if other.alpha != self.alpha:
            raise ValueError(f"cannot merge sketches of alpha {self.alpha} and {other.alpha}")
        c = self.counts
        for k, s in other.counts.items():
            c[k] = c.get(k, 0.0) + s
        self.zero += other.zero
        self.total += other.total
        self.sum += other.sum
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    @property
    def count(self) -> float:
        return self.total

    def mean(self) -> float:
        return self.sum / self.total if self.total > 0 else math.nan

    def quantiles(self, qs: tuple[float, ...]) -> list[float]:
        """The q-quantiles (q in [0, 1]), each within relative alpha of the exact inverted CDF."""
        if self.total <= 0:
            return [math.nan] * len(qs)
        keys = sorted(self.counts)
        cum = np.cumsum([self.counts[k] for k in keys]) + self.zero if keys else np.zeros(0)
        out = []
        for q in qs:
            target = q * self.total
            if self.zero > 0 and self.zero >= target:
                out.append(max(min(0.0, self.max), self.min))
                continue
            i = int(np.searchsorted(cum, target, side="left")) if keys else 0
            # Float sums may leave the last cumulative weight a hair under the total.
            k = keys[min(i, len(keys) - 1)]
            est = 2.0 * self.gamma ** k / (self.gamma + 1.0)
            out.append(min(max(est, self.min), self.max))
        return out
