"""`inferasim validate`: score the predictor on measured runs (DESIGN.md section 7)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from inferasim.cli.args import check_output_folder
from inferasim.cli.usage import UsageError, add_output, load_rows_noted, progress, usage_check
from inferasim.output import emit, table
from inferasim.sources import SOURCE_RULES


def _validation_text(s: dict[str, Any], data: str, rule: str) -> str:
    """`validate`'s report for people: the figures of summary.json as tables and lines."""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    out: list[str] = []
    metric_rows = []
    coverage = s.get("interval_coverage") or {}
    for name in ("tpot", "ttft", "throughput_per_gpu", "batch_latency"):
        m = s.get(name) or {}
        if m.get("n"):
            inside = (coverage.get(name) or {}).get("share")
            metric_rows.append((name, pct(m["median_ape"]), pct(m["p90_ape"]), pct(inside), m["n"]))
    out.append(table(["metric", "median APE", "p90 APE", "inside interval", "n"], metric_rows,
                     title=f"Validation of {data} (anchor rule {rule})"))
    r = s.get("ranking") or {}
    out.append(f"ranking: pair accuracy {pct(r.get('pair_accuracy'))} over {r.get('pairs', 0)} pairs "
               f"(equal GPU count {pct(r.get('pair_accuracy_equal_gpus'))} over {r.get('pairs_equal_gpus', 0)}), "
               f"top-1 {pct(r.get('top1'))}, regret {pct(r.get('regret'))}")
    unmeasured = (s.get("unmeasured") or {}).get("n", 0)
    out.append(f"anchor share {pct(s.get('anchor_share'))} of rows, {pct(s.get('anchor_gpu_time_share'))} of measured "
               f"GPU time; unpredicted rows {s.get('unpredicted', {}).get('n', 0)}"
               + (f"; {unmeasured} rows without any measured value (predicted, not scored)" if unmeasured else ""))
    counts = s.get("counts") or {}
    if counts.get("excluded_engine") or counts.get("excluded_mode"):
        out.append(f"not validated: {counts.get('excluded_engine', 0)} rows of other engines (only vllm, sglang, "
                   f"atom), {counts.get('excluded_mode', 0)} of other modes (only agg, disagg)")
    for u in s.get("unusable_anchors") or []:
        out.append(f"unusable anchor {u['kernel_set']} ({len(u['rows'])} anchor rows): {u['reason']}")
    for key, label in (("disagg", "disaggregated"),
                       ("measurement_free", "disaggregated without an aggregated anchor (measurement-free)")):
        d = s.get(key) or {}
        if any((d.get(k) or {}).get("n") for k in ("tpot", "ttft")):
            n = max((d.get(k) or {}).get("n") or 0 for k in ("tpot", "ttft"))
            out.append(f"{label}, {n} rows: " + ", ".join(f"{k} median {pct((d.get(k) or {}).get('median_ape'))}"
                                                         for k in ("tpot", "ttft", "throughput_per_gpu")))
    for split, per_value in (s.get("splits") or {}).items():
        split_rows = []
        for value, sec in per_value.items():
            counts = sec.get("counts") or {}
            # A group of disaggregated rows only (reach "disagg", or "no anchor": measurement-free)
            # shows its disaggregated figures.
            kind = "agg" if counts.get("scored_agg") else "disagg" if counts.get("scored_disagg") else \
                "measurement_free" if counts.get("scored_measurement_free") else "agg"
            block = sec if kind == "agg" else sec.get(kind) or {}
            split_rows.append((value, counts.get(f"scored_{kind}", 0),
                               *(pct((block.get(k) or {}).get("median_ape"))
                                 for k in ("tpot", "ttft", "throughput_per_gpu")),
                               pct(sec.get("anchor_share")), (sec.get("unpredicted") or {}).get("n", 0)))
        out.append(table([split, "scored rows", "TPOT", "TTFT", "throughput/GPU", "anchor share", "unpredicted"],
                         split_rows, title=f"median APE by {split}"))
    return "\n".join(out)


def cmd_validate(args: argparse.Namespace) -> int:
    from inferasim.model.predictor import AnchoredPredictor
    from inferasim.validate import run_validation
    from inferasim.validation_outputs import write_outputs

    # Repeated flags add up (--split-by engine --split-by gpu), as do comma lists; a key twice counts once.
    split_by = tuple(dict.fromkeys(s.strip() for flag in (args.split_by or []) for s in flag.split(",") if s.strip()))
    usage_check(check_output_folder, "--out", args.out)
    try:
        Path(args.out).mkdir(parents=True, exist_ok=True)  # now: a refusal after the scoring would lose it
    except OSError as exc:
        raise UsageError(f"--out {args.out}: cannot create the folder ({exc.strerror})") from None
    for name in ("predictions.csv", "summary.json"):
        if (Path(args.out) / name).is_dir():
            raise UsageError(f"--out {args.out}: {name} there is a folder; give another --out")
    # One cell nobody can read must not cost the whole run: such cells are listed, not fatal.
    unreadable: list[Any] = []
    applied: dict[str, int] = {}
    rows = load_rows_noted(args.data, unreadable, as_written=args.as_written, applied=applied)
    result = run_validation(rows, AnchoredPredictor(), rule=args.anchor_rule, split_by=split_by,
                            progress=progress, unreadable=unreadable, measurement_free=args.measurement_free)
    out = Path(args.out)
    # Which source rules read the file's rows as their engine ran them (none with --as-written).
    result.summary["source_rules"] = {r.name: {"rows": applied[r.name], "why": r.why}
                                      for r in SOURCE_RULES if applied.get(r.name)}
    write_outputs(result, out)
    s = result.summary

    # The report for people, or (-o json / yaml) summary.json's figures for programs.
    emit(s, args.output, _validation_text(s, args.data, args.anchor_rule))
    print(f"wrote {out / 'predictions.csv'} and {out / 'summary.json'}",
          file=sys.stdout if args.output == "table" else sys.stderr)
    c = s["counts"]
    if c["scored_agg"] + c["scored_disagg"] == 0:
        # Nothing scored is a failed check, not a perfect one: say why (the counts show where rows went).
        print(f"inferasim validate: no row was scored: {c['rows']} rows read, {c['excluded_engine']} of an engine "
              f"validate does not score, {c['excluded_mode']} of another mode, {c['anchor_rows']} anchor rows, "
              f"{c.get('unreadable_rows', 0)} unreadable; scoring needs at least two layouts or length pairs of one "
              "kernel set", file=sys.stderr)
        return 1
    return 0


def add_cli(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`inferasim validate`."""
    p = sub.add_parser("validate", help="score the predictor on measured runs (DESIGN.md section 7)")
    p.add_argument("data", help="CSV of measured runs (schema of shared/data/aic-silicon/silicon_dev.csv)")
    p.add_argument("--anchor-rule", default="min-gpus", choices=("min-gpus", "harvest"),
                   help="which rows of a kernel set form its anchor (DESIGN.md section 7): min-gpus, every row of "
                        "the fewest-GPU layout at its shortest length pair; harvest, what `harvest run` measures "
                        "by default (the pair nearest 512x128 at up to 4 concurrencies, the longest prompt at one)")
    p.add_argument("--as-written", action="store_true",
                   help="read every row's layout as the file writes it, without the named rules of known public "
                        "sources (inferasim/sources.py; e.g. Argonne counts an MI250 package of two GCDs as one GPU)")
    p.add_argument("--measurement-free", action="store_true",
                   help="leave one kernel set out: price every row of each kernel set, its anchor rows too, from "
                        "the population of the other kernel sets' anchors (model/priors.py), with no row of its own")
    p.add_argument("--out", required=True, help="folder for predictions.csv and summary.json")
    add_output(p)
    p.add_argument("--split-by", action="append", default=[],
                   help="engine, gpu, model or reach; a comma list or the flag repeated (reach: what a "
                        "prediction carries from its anchor: another length pair, another layout, both, or "
                        "disaggregated pools)")
    p.set_defaults(func=cmd_validate)
