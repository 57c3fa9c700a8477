"""`inferasim anchors`: list, show and check anchors, build them from a CSV, fit one from live
traffic (fit-live), and the prediction error of a live deployment (drift)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inferasim.cli.args import check_output_folder
from inferasim.cli.args import positive_float as _positive_float
from inferasim.cli.usage import (
    ANCHOR_DIR,
    UsageError,
    add_output,
    anchors_in,
    check_prometheus_url,
    load_rows_noted,
    parse_selector,
    progress,
    usage_check,
)
from inferasim.model.anchor_store import AnchorStore
from inferasim.model.anchors import Anchor, AnchorFileError, load_anchor
from inferasim.output import emit, table

# Every attribute cmd_anchors reads, at its default: each action's subparser defines only its own
# flags (a flag of another action is refused by argparse: `anchors build --out X` once wrote into
# anchors/ when the flags were shared).
_DEFAULTS: dict[str, object] = {"prometheus": None, "selector": [], "deployment": None, "gpu": None,
                                "engine_version": None, "window": None, "step": "1m", "end": None, "speedup": 1.0,
                                "out": None, "threshold": 0.25, "replace": False, "dir": None, "name": None}


def cmd_anchors(args: argparse.Namespace) -> int:
    if args.action == "check":
        # An explicit folder that does not exist is a typo, not an empty store (list and show get
        # the same check from anchor_store; check reads the store itself, to list its bad files).
        for folder in args.dir or []:
            if not Path(folder).is_dir():
                raise UsageError(f"--dir {folder!r} is not a folder of anchor JSON files")
        return _anchors_check(args)
    if args.action in ("fit-live", "drift"):
        return _anchors_live(args)
    if args.action == "build":
        return _anchors_build(args)
    store = anchors_in(args.dir, "--dir")
    if args.action == "list":
        items = store.all()
        data = [{"id": a.id, "file": a.filename(), "kernel_set": a.kernel_set.model_dump(),
                 "layout": a.layout.model_dump(), "points": len(a.points),
                 "rms_log_error": a.fit.rms_log_error if a.fit else None, "method": a.provenance.method}
                for a in items]
        rows = [(a.id, a.kernel_set.engine, a.kernel_set.engine_version or "-", a.kernel_set.model,
                 a.kernel_set.gpu, a.kernel_set.precision or "-", a.layout.to_layout().label(), len(a.points),
                 a.fit.rms_log_error if a.fit else None, a.provenance.method) for a in items]
        emit(data, args.output, table(["id", "engine", "version", "model", "gpu", "precision", "layout", "points",
                                       "fit rms(log)", "provenance"], rows))
        return 0
    if args.action == "show":
        if not args.name:
            raise UsageError("anchors show needs an anchor id or file name (see `inferasim anchors list`)")
        path = Path(args.name)
        if path.is_file():
            anchor = load_anchor(path)
        else:
            stem = args.name.removesuffix(".json")
            hits = [a for a in store.all() if a.id == args.name or a.filename().removesuffix(".json") == stem
                    or a.id.startswith(args.name)]
            if not hits:
                raise UsageError(f"no anchor {args.name!r}; `inferasim anchors list` shows the ids")
            anchor = hits[0]
        emit(anchor.model_dump(mode="json"), args.output, _anchor_table(anchor))
        return 0
    raise UsageError(f"unknown anchors action {args.action!r}")


def _anchor_table(anchor: Anchor) -> str:
    """One anchor for a person: what it measured, where, how well the fit holds, its parameters
    (`-o json` gives every point)."""
    ks, lay, fit, rng = anchor.kernel_set, anchor.layout, anchor.fit, anchor.measured_range
    rows: list[tuple[str, Any]] = [
        ("id", anchor.id), ("kernel set", ks.describe()),
        ("layout", f"tp{lay.tp} pp{lay.pp} dp{lay.dp} moe_tp{lay.moe_tp or '-'} moe_ep{lay.moe_ep}"),
        ("points", f"{len(anchor.points)} benchmark, {len(anchor.steps)} step"),
    ]
    if rng is not None:
        rows += [("concurrency", f"{rng.concurrency[0]}-{rng.concurrency[1]}"),
                 ("isl", f"{rng.isl[0]}-{rng.isl[1]}"), ("osl", f"{rng.osl[0]}-{rng.osl[1]}")]
    if fit is not None:
        rows += [("fit rms(log)", f"{fit.rms_log_error:.3f} over {fit.n_points} points"),
                 ("fit per metric (median APE)", ", ".join(f"{k} {v:.1%}" for k, v in fit.per_metric.items()))]
    rows += [("provenance", f"{anchor.provenance.method}: {anchor.provenance.source}"),
             ("measured at", anchor.provenance.measured_at or "-")]
    rows += [(f"  {k}", f"{v:.4g}") for k, v in sorted(anchor.params.items())]
    return table(["anchor", "value"], rows)


def _anchors_build(args: argparse.Namespace) -> int:
    """`anchors build CSV [--out FOLDER]`: the min-gpus anchor of each kernel set in the CSV."""
    from inferasim.anchor_rules import select_anchors
    from inferasim.core.runs import filter_rows
    from inferasim.errors import CannotPredict
    from inferasim.model.predictor import anchor_from_rows

    if not args.name:
        raise UsageError("anchors build needs a CSV of measured runs (the validate schema)")
    if args.out and args.dir:
        raise UsageError("give the destination once: --out FOLDER (or --dir FOLDER), not both")
    out = Path(args.out) if args.out else Path(args.dir[0]) if args.dir else ANCHOR_DIR
    usage_check(check_output_folder, "--out" if args.out else "--dir", str(out))
    every = load_rows_noted(args.name)
    rows = filter_rows(every)
    if len(rows) < len(every):  # trtllm rows, other modes: said, not dropped silently
        print(f"not used: {len(every) - len(rows)} of {len(every)} rows (engines other than vllm, sglang, atom, "
              "or modes other than agg, disagg)", file=sys.stderr)
    chosen = select_anchors(rows)
    built: list[Anchor] = []
    for i, (_key, choice) in enumerate(chosen.items(), 1):
        progress(i, len(chosen))
        try:
            built.append(anchor_from_rows(choice.rows, source=f"{Path(args.name).name}: {choice.describe()}"))
        except CannotPredict as exc:
            print(f"skipped {choice.describe()}: {exc}", file=sys.stderr)
    # Never replace a different anchor without being asked: the default folder holds the
    # shipped anchors. Checked before writing anything, so a refusal leaves the folder as it was.
    clash = [a.filename() for a in built if (out / a.filename()).is_file() and not _same_fit(out / a.filename(), a)]
    if clash and not args.replace:
        raise UsageError(f"{len(clash)} anchor(s) in {out} would be replaced by different fits "
                         f"({', '.join(clash[:3])}{', ...' if len(clash) > 3 else ''}); pass --replace to "
                         "replace them, or --out FOLDER to write elsewhere")
    same = {a.filename() for a in built if (out / a.filename()).is_file() and a.filename() not in clash}
    store = AnchorStore(out)
    for anchor in built:
        if anchor.filename() not in same:  # an unchanged fit keeps its file as it is
            store.save(anchor, out, keep_previous=False)  # --replace asked for it (clashes refused above)
    if not built:
        # Nothing to anchor on is a failure: a pipeline building anchors must not carry on.
        print(f"inferasim anchors build: no anchor built from {args.name} ({len(chosen)} kernel sets, "
              f"{len(rows)} usable rows)", file=sys.stderr)
        return 1
    written = [a for a in built if a.filename() not in same]
    emit({"folder": str(out), "written": [a.filename() for a in written], "replaced": clash,
          "unchanged": sorted(same)}, args.output,
         f"wrote {len(written)} anchors to {out}" + (f" ({len(clash)} replaced)" if clash else "")
         + (f"; {len(same)} unchanged" if same else ""))
    return 0


def _same_fit(path: Path, anchor: Anchor) -> bool:
    """The anchor file at `path` holds `anchor`'s points and parameters (to fit precision: a refit
    on another machine differs in the last digits)."""
    try:
        old = load_anchor(path)
    except AnchorFileError:
        return False
    if old.points != anchor.points or old.params.keys() != anchor.params.keys():
        return False
    # Parameters fitted under another step-model revision mean something else: rewrite the file.
    if (old.fit.step_model if old.fit else None) != (anchor.fit.step_model if anchor.fit else None):
        return False
    return all(math.isclose(old.params[k], v, rel_tol=1e-6, abs_tol=1e-12) for k, v in anchor.params.items())


def _anchors_check(args: argparse.Namespace) -> int:
    """`anchors check [FILE|FOLDER]`: schema (every file parses as an Anchor) and compatibility
    (its model, GPU, engine and precision resolve in this version's catalogs and it yields fitted
    parameters). Fits worse than the harvester's own threshold are reported, not failed. Exit 1
    when a file is invalid or unusable."""
    from inferasim.errors import CannotPredict
    from inferasim.harvest.run import DEFAULT_MAX_RMS_LOG_ERROR
    from inferasim.model.memory import layout_problems
    from inferasim.model.predictor import fitted_from_anchor, stale_params
    from inferasim.model.steptime import STEP_MODEL_REVISION, StepParams

    anchors: list[tuple[str, Anchor]] = []
    bad: list[AnchorFileError] = []
    if args.name:
        target = Path(args.name)
        if not target.exists() and args.dir:
            # A name inside a --dir folder, with or without .json (as `anchors show` takes it).
            found = [c for d in args.dir for c in (Path(d) / args.name, Path(d) / f"{args.name}.json")
                     if c.exists()]
            target = found[0] if found else target
        if target.is_file():
            try:
                anchors.append((str(target), load_anchor(target)))
            except AnchorFileError as exc:
                bad.append(exc)
        elif target.is_dir():
            store = AnchorStore(target)
            anchors, bad = [(str(p), a) for p, a in store.items()], store.errors()
        else:
            raise UsageError(f"anchors check: {args.name!r} is neither an anchor JSON file nor a folder of them")
    else:
        store = AnchorStore(*([Path(d) for d in args.dir] if args.dir else [ANCHOR_DIR]))  # its errors: below
        anchors, bad = [(str(p), a) for p, a in store.items()], store.errors()
    for err in bad:
        print(f"invalid: {err}", file=sys.stderr)
    problems = poor = 0
    report: list[dict[str, Any]] = []
    for where, a in anchors:
        try:
            fitted = fitted_from_anchor(a)
            # A layout the engine would refuse (tp not dividing the heads) was never measured.
            why = layout_problems(fitted.model, a.layout.to_layout(), fitted.engine)
            if why:
                raise ValueError(f"{fitted.engine} cannot run layout {a.layout.to_layout().label()}: {'; '.join(why)}")
        except (CannotPredict, ValueError) as exc:
            problems += 1
            print(f"unusable: {where} ({a.id}): {exc}", file=sys.stderr)
            continue
        stale = stale_params(a)
        if stale:
            print(f"note: {where} ({a.id}): {stale} on every read; `inferasim anchors build` (or a new "
                  "harvest) stores the refit", file=sys.stderr)
        elif a.params and (a.fit is None or not a.fit.step_model):
            print(f"note: {where} ({a.id}): no step-time model revision recorded; its parameters are read "
                  f"as fitted under this one ({STEP_MODEL_REVISION}). Refit it if it predates that.",
                  file=sys.stderr)
        unused = sorted(set(a.params) - set(StepParams.__dataclass_fields__))
        if unused:
            print(f"note: {where} ({a.id}): parameters this version does not use (a newer writer, or a typo): "
                  f"{', '.join(unused)}", file=sys.stderr)
        if a.fit is not None and a.fit.rms_log_error > DEFAULT_MAX_RMS_LOG_ERROR:
            poor += 1
            print(f"poor fit: {where} ({a.id}): rms log error {a.fit.rms_log_error:.3f} is above "
                  f"{DEFAULT_MAX_RMS_LOG_ERROR:g}, the threshold below which `harvest run` writes an anchor",
                  file=sys.stderr)
        ident = fitted.identification()
        report.append({"file": where, "id": a.id, "name": Path(where).stem, "points": len(a.points),
                       "identification": ident.as_dict() if ident else None})
    # Every file counts once: invalid (does not parse), unusable (parses, cannot predict) or usable.
    summary = (f"{len(anchors) + len(bad)} anchor files: {len(anchors) - problems} usable, {len(bad)} invalid, "
               f"{problems} unusable; {poor} with a poor fit")
    emit({"anchors": report, "summary": summary, "invalid": [str(e) for e in bad]}, args.output,
         _identification_text(report) + summary)
    if not anchors and not bad:
        # A pipeline checking the wrong folder must not pass: nothing checked is not "all valid".
        print("inferasim anchors check: no anchor JSON file found", file=sys.stderr)
        return 1
    return 1 if bad or problems else 0


def _identification_text(report: list[dict[str, Any]]) -> str:
    """What each usable anchor's points decide and what they leave to priors (model.identify):
    a prediction that leans on a prior-led parameter says so, and is less sure than its band."""
    rows, hints = [], []
    for r in report:
        ident = r["identification"]
        if ident is None:  # steps-only or measurement-free: the points do not pose a benchmark fit
            rows.append((r["name"], r["points"], "(isolated steps: GPU terms from the steps)", "-"))
            continue
        params = ident["params"]
        led = [n if p["data_share"] is None else f"{n} ({p['data_share']:.2f})"
               for n, p in params.items() if p["source"] != "data" and n != "m_tile"]
        rows.append((r["name"], r["points"], ", ".join(n for n, p in params.items() if p["source"] == "data") or "-",
                     ", ".join(led) or "-"))
        hints += [f"hint: {r['name']}: {h}" for h in ident["hints"]]
    text = table(["anchor", "points", "fitted from its points", "left to priors (data share)"], rows)
    return text + "\n" + "".join(h + "\n" for h in hints)


def _live_selector(items: Sequence[str]) -> dict[str, str]:
    """--selector, required: the deployment's own series."""
    selector = parse_selector(items)
    if not selector:
        raise UsageError("--selector is required: the label matchers of the deployment's series, e.g. "
                         "--selector namespace=llm,app=chat")
    return selector


def _anchors_live(args: argparse.Namespace) -> int:
    """`anchors fit-live` (a passive anchor from live traffic) and `anchors drift` (prediction error)."""
    import time

    from inferasim.deployment import read_deployment
    from inferasim.live import fit_live
    from inferasim.observe import ObservationError, observe_windows, parse_duration
    from inferasim.passive import NotIdentifiable

    cmd = f"inferasim anchors {args.action}"
    for flag, value in (("--prometheus", args.prometheus), ("--deployment", args.deployment)):
        if not value:
            raise UsageError(f"anchors {args.action} needs {flag}")
    check_prometheus_url(args.prometheus)
    selector = _live_selector(args.selector)
    live = read_deployment(args.deployment, gpu=args.gpu, engine_version=args.engine_version)
    try:
        window = parse_duration(args.window or ("1h" if args.action == "fit-live" else "5m"), "--window")
        step = parse_duration(args.step, "--step")
    except ObservationError as exc:
        raise UsageError(str(exc)) from None
    end = _live_end(args.end) if args.end else time.time()
    try:
        if args.action == "fit-live":
            anchor = fit_live(live, args.prometheus, selector, window_s=window, step_s=step, end=end)
        else:
            windows = observe_windows({"url": args.prometheus, "selector": selector}, end - window, end, window,
                                      live.engine)
    except NotIdentifiable as exc:
        print(f"{cmd}: not identifiable: {exc}", file=sys.stderr)
        return 1
    except ObservationError as exc:
        print(f"{cmd}: {exc}", file=sys.stderr)
        return 1
    if args.action == "fit-live":
        return _write_live_anchor(anchor, args, cmd)
    from inferasim.drift import prediction_error

    if not windows:
        print(f"{cmd}: no request finished in the last {args.window or '5m'}: nothing to compare", file=sys.stderr)
        return 1
    err = prediction_error(live, windows[-1], anchors_in(args.dir, "--dir"), speedup=args.speedup)
    rows = [(m, err.observed.get(m), err.predicted[m], err.relative.get(m)) for m in ("ttft", "itl", "throughput")]
    emit(err.as_dict(), args.output, table(["metric (ms, tok/s)", "observed", "predicted", "relative error"], rows))
    if err.exceeds(args.threshold):
        print(f"{cmd}: prediction error {err.worst():.0%} exceeds {args.threshold:.0%} (anchor {err.anchor_id})",
              file=sys.stderr)
        return 1
    return 0


def _live_end(text: str) -> float:
    """--end: Unix seconds or an ISO 8601 time (UTC unless it names a zone)."""
    import datetime as dt

    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--end {text!r} is neither Unix seconds nor an ISO 8601 time "
                         "(e.g. 2025-06-01T14:00:00Z)") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


def _write_live_anchor(anchor: Any, args: argparse.Namespace, cmd: str) -> int:
    from inferasim.harvest.run import write_anchor

    out = args.out or "-"
    if out != "-" and (Path(out).is_dir() or not out.endswith(".json")):
        store = AnchorStore(out)
        path = store.save(anchor, out)
        print(f"{cmd}: wrote {path} (fit rms log error {anchor.fit.rms_log_error:.3f}, {len(anchor.points)} windows)",
              file=sys.stderr)
        if store.last_replaced is not None:
            print(f"{cmd}: {path.name} held another anchor: kept it as {store.last_replaced}", file=sys.stderr)
        # Both a harvested and a passive anchor of these kernels may be stored: show which one wins.
        for i, (p, a) in enumerate(store.alternatives(anchor.kernel_set, anchor.layout.to_layout())):
            rms = f"{a.fit.rms_log_error:.3f}" if a.fit else "-"
            print(f"  {'used' if i == 0 else 'kept'}: {p.name} ({a.provenance.method}, fit rms log error {rms})",
                  file=sys.stderr)
        return 0
    path = write_anchor(anchor, out, on_replace=lambda p, kept: print(
        f"{cmd}: {p} held another anchor: kept it as {kept}", file=sys.stderr))
    if path is not None:
        print(f"{cmd}: wrote {path} (fit rms log error {anchor.fit.rms_log_error:.3f})", file=sys.stderr)
    return 0


def add_cli(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`inferasim anchors ACTION`: one subcommand per action, each with only its own flags and help
    (a flag of another action is an argparse error naming it, not silently ignored)."""
    p = sub.add_parser("anchors", help="list, show, check shipped anchors; build anchors from a CSV; fit one from "
                                       "live traffic (fit-live); prediction error of a live deployment (drift)",
                       description="Anchors: one measured kernel set each (anchors/ by default).")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, text: str) -> argparse.ArgumentParser:
        # No abbreviations: `--out` must not pass for `--output` where an action has no --out.
        a = actions.add_parser(name, help=text, description=text, allow_abbrev=False)
        a.set_defaults(func=cmd_anchors, **_DEFAULTS)
        add_output(a)
        return a

    def dirs(a: argparse.ArgumentParser) -> None:
        a.add_argument("--dir", action="append", default=None, metavar="FOLDER",
                       help="anchor folder; repeat for several (default: anchors/)")

    def live(a: argparse.ArgumentParser, window: str) -> None:
        a.add_argument("--prometheus", default=None, help="Prometheus base URL (http://host:9090)")
        a.add_argument("--selector", action="append", default=[], metavar="K=V[,K=V]",
                       help="label matchers of the deployment's series (namespace, deployment or app)")
        a.add_argument("--deployment", default=None, help="the Deployment manifest (YAML) the series come from")
        a.add_argument("--gpu", default=None, help="GPU, when the manifest's node selector names none")
        a.add_argument("--engine-version", default=None, help="engine version, when the image tag names none")
        a.add_argument("--window", default=None, help=f"range of the series to read (default {window})")
        a.add_argument("--end", default=None, help="end of the range, Unix seconds or ISO 8601 (default: now)")

    dirs(action("list", "the anchors in the folder(s): kernel set, layout, points, fit"))
    show = action("show", "one anchor: what it measured, how well the fit holds, its parameters")
    show.add_argument("name", help="anchor id (or a prefix of it), file name, or path to an anchor JSON file")
    dirs(show)
    check = action("check", "schema and catalog compatibility of anchor files (exit 1 if one is invalid or "
                            "unusable), and what each anchor's points identify")
    check.add_argument("name", nargs="?", help="anchor JSON file or folder (default: --dir, else anchors/)")
    dirs(check)
    build = action("build", "fit the min-gpus anchor of each kernel set in a CSV of measured runs")
    build.add_argument("name", metavar="CSV", help="measured runs in the validate schema (../shared/data)")
    build.add_argument("--out", default=None, metavar="FOLDER",
                       help="the folder to write (default: --dir, else anchors/)")
    build.add_argument("--replace", action="store_true",
                       help="replace anchors of the same kernel set and layout that fit differently")
    dirs(build)
    fit = action("fit-live", "fit an anchor from a live deployment's Prometheus series")
    live(fit, "1h")
    fit.add_argument("--step", default="1m", help="one fitted window per step (default 1m)")
    fit.add_argument("--out", default=None, help="anchor folder, file, or - for stdout (default -)")
    drift = action("drift", "a live deployment's measured latencies against the prediction (exit 1 beyond "
                            "--threshold)")
    live(drift, "5m")
    drift.add_argument("--speedup", type=_positive_float("speedup"), default=1.0,
                       help="engine seconds per wall second (the emulator's --speedup; 1 for real engines)")
    drift.add_argument("--threshold", type=_positive_float("threshold"), default=0.25,
                       help="exit 1 when a relative error exceeds this fraction (default 0.25)")
    dirs(drift)
