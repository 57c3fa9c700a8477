"""How well each dev anchor fits its own rows (issue 26: every anchor within 8% median TTFT).

    python benchmarks/self_fit.py

For every kernel set of the dev file, the anchor the min-gpus rule selects is fitted on its rows
and predicts the same rows back: the median absolute TTFT and TPOT error per anchor, then per
engine how many anchors are within 8% TTFT, the median anchor and the worst ones. An anchor that
misses its own rows cannot carry them anywhere: the fit, not a transfer law, is what is off there.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from inferasim.anchor_rules import select_anchors  # noqa: E402
from inferasim.core.runs import filter_rows, load_rows  # noqa: E402
from inferasim.errors import InferasimError  # noqa: E402
from inferasim.model.predictor import fit_anchor_rows  # noqa: E402
from inferasim.sources import read_as_run  # noqa: E402
from inferasim.validate import RowResult, metric_values  # noqa: E402

DEV = REPO.parent / "shared" / "data" / "aic-silicon" / "silicon_dev.csv"
TARGET = 0.08  # median TTFT error of an anchor on its own rows


def self_fit(path: Path) -> dict[str, list[tuple[str, float, float, int]]]:
    """Per engine: (anchor, median TTFT error, median TPOT error, rows) of every anchor that fits."""
    rows = filter_rows(read_as_run(load_rows(path)))
    out: dict[str, list[tuple[str, float, float, int]]] = defaultdict(list)
    for choice in select_anchors(rows).values():
        try:
            fitted = fit_anchor_rows(choice.rows)
        except InferasimError:
            continue  # validate reports these (an anchor at a layout the engine cannot start)
        ttft, tpot = [], []
        for r in choice.rows:
            p = fitted.predict(r)
            # Scored as validate scores a row (its metric values and error).
            scored = RowResult(r, "ok", measured=metric_values(r, r.ttft_ms, r.tpot_ms, None, None),
                               predicted=metric_values(r, p.ttft_ms, p.tpot_ms, None, None))
            for errs, name in ((ttft, "ttft"), (tpot, "tpot")):
                e = scored.ape(name)
                if e is not None:
                    errs.append(e)
        if ttft:
            out[fitted.engine].append((fitted.anchor_id, float(np.median(ttft)),
                                       float(np.median(tpot)) if tpot else float("nan"), len(choice.rows)))
    return out


def main() -> int:
    if not DEV.exists():
        print(f"skipped self-fit: {DEV} not present")
        return 0
    per = self_fit(DEV)
    print(f"Anchor self-fit on {DEV.name} (each anchor predicting its own rows; target: median TTFT <= "
          f"{TARGET:.0%} per anchor)")
    for engine, fits in sorted(per.items()):
        ttfts = np.array([f[1] for f in fits])
        within = int((ttfts <= TARGET).sum())
        print(f"  {engine}: {len(fits)} anchors, {within} within {TARGET:.0%} TTFT ({within / len(fits):.0%}); "
              f"median anchor TTFT {np.median(ttfts):.1%}, TPOT {np.nanmedian([f[2] for f in fits]):.1%}")
        for anchor, t, p, n in sorted(fits, key=lambda f: -f[1])[:3]:
            if t > TARGET:
                print(f"    worst: {anchor} ({n} rows): TTFT {t:.1%}, TPOT {p:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
