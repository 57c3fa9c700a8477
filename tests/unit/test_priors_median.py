"""The prior book's plain-Python medians (issue 29: numpy's per-call cost dominated the population)
give numpy's values exactly, so that priors and bands did not move."""

from __future__ import annotations

import random

import numpy as np

from inferasim.model.priors import _median, _robust_sd


def test_median_and_robust_sd_are_numpys_to_the_bit() -> None:
    rng = random.Random(29)
    for n in range(1, 40):
        for _ in range(20):
            v = [rng.gauss(0.0, 1.0) * 10.0 ** rng.randint(-3, 3) for _ in range(n)]
            a = np.array(v)
            assert _median(v) == float(np.median(a))
            ref = 0.0 if n < 2 else 1.4826 * float(np.median(np.abs(a - np.median(a))))
            assert _robust_sd(v) == ref
