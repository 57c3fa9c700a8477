"""The operator under load (issue 25): N distinct ServingTunings applied at once on a real control
plane, the operator running as a process under the chart's RBAC.

    .venv/bin/python benchmarks/operator_scale.py [--tunings 100] [--namespaces 1] [--stage2-top 50]
                                                   [--workers 0] [--search-timeout 300] [--json out.json]

Measures: time from the first create to every tuning terminal (Recommended, Failed or Invalid),
time from each tuning's creation to the first phase it shows (and to Queued with its place),
and the peak resident memory of the operator and all its children (the search workers) together,
sampled every 0.2 s from /proc. Budgets of the issue: all terminal within 120 s on 2 cores, under
1 GB peak; a phase within 2 s of creation. Uses the local Kubernetes v1.20 control plane of the
e2e tests (scripts/k8s; make test-deps), or INFERASIM_E2E_KUBECONFIG.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from inferasim_e2e_support import (  # noqa: E402
    GROUP,
    OPERATOR_NS,
    OPERATOR_SA,
    PLURAL,
    VERSION,
    ControlPlane,
    OperatorProcess,
    api_client,
    control_plane_missing,
    free_port,
    grant_namespace,
    service_account_kubeconfig,
)

TERMINAL = ("Recommended", "Failed", "Invalid")
MODEL = "meta-llama/Meta-Llama-3-8B"


def tree_rss_mb(root: int) -> float:
    """Resident memory of ``root`` and all its descendants, MB (from /proc)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            pass
    return total


class Sampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop_ = pid, 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop_.is_set():
            self.peak = max(self.peak, tree_rss_mb(self.pid))
            self.stop_.wait(0.2)


def spec(i: int) -> dict[str, Any]:
    # Distinct searches: each its own request rate and prompt length (none shared or reused).
    return {"target": {"name": "chat"}, "model": MODEL, "precision": ["bf16"],
            "hardware": {"gpu": "MI300X", "gpusPerNode": 8, "maxGPUs": 8}, "engines": ["vllm"],
            "workload": {"static": {"kind": "poisson", "requestRate": round(1 + 0.37 * i, 2),
                                    "inputTokens": 256 + 16 * i, "outputTokens": 128}}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tunings", type=int, default=100)
    p.add_argument("--namespaces", type=int, default=1)
    p.add_argument("--stage2-top", type=int, default=50, help="candidates simulated per search (chart default 50)")
    p.add_argument("--workers", type=int, default=0, help="search pool size (0: the operator's default, the CPUs)")
    p.add_argument("--search-timeout", type=float, default=300)
    p.add_argument("--burst-stage2-top", type=int, default=-1,
                   help="stage 2 of searches under a burst (-1: the operator's default; 0: never shortened)")
    p.add_argument("--deadline", type=float, default=900, help="give up after this many seconds")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)

    from kubernetes import client

    external = os.environ.get("INFERASIM_E2E_KUBECONFIG")
    cp = None
    if external:
        kubeconfig = Path(external)
    else:
        why = control_plane_missing()
        if why:
            print(f"operator_scale: {why}", file=sys.stderr)
            return 2
        cp = ControlPlane()
        cp.start(REPO / "crds")
        kubeconfig = cp.kubeconfig
        print(f"control plane up in {cp.started_s:.1f} s")
    api = api_client(kubeconfig)
    core, rbac, custom = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api), client.CustomObjectsApi(api)
    tag = uuid.uuid4().hex[:6]
    namespaces = [f"scale-{tag}-{k}" for k in range(args.namespaces)]
    op_ns = namespaces[0]
    tmp = Path(tempfile.mkdtemp(prefix="inferasim-scale-"))
    op = sampler = None
    try:
        from inferasim_operator.rbac import cluster_role

        for ns in [OPERATOR_NS, *namespaces]:
            try:
                core.create_namespace({"metadata": {"name": ns}})
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
        try:
            core.create_namespaced_service_account(OPERATOR_NS, {"metadata": {"name": OPERATOR_SA}})
        except client.ApiException as exc:
            if exc.status != 409:
                raise
        role = f"inferasim-scale-{tag}"
        rbac.create_cluster_role(cluster_role(role))
        rbac.create_cluster_role_binding({
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NS}]})
        for ns in namespaces:
            grant_namespace(api, ns, operator_namespace=(ns == op_ns))
        sa_kubeconfig = service_account_kubeconfig(api, kubeconfig, OPERATOR_NS, OPERATOR_SA, tmp / "sa.kubeconfig")
        (tmp / "anchors").mkdir()
        env = {"INFERASIM_ANCHOR_DIRS": str(REPO / "anchors"), "INFERASIM_ANCHOR_CACHE": str(tmp / "cache"),
               "INFERASIM_STAGE2_TOP": str(args.stage2_top), "INFERASIM_SEARCH_WORKERS": str(args.workers),
               "INFERASIM_SEARCH_TIMEOUT_S": str(args.search_timeout), "INFERASIM_OPERATOR_NAMESPACE": op_ns,
               **({"INFERASIM_SEARCH_BURST_STAGE2_TOP": str(args.burst_stage2_top)} if args.burst_stage2_top >= 0
                  else {}),
               "INFERASIM_METRICS_PORT": str(free_port()), "INFERASIM_METRICS_ADDR": "127.0.0.1"}
        op = OperatorProcess(sa_kubeconfig, namespaces, env, tmp / "operator.log")
        op.start()
        assert op.proc is not None
        sampler = Sampler(op.proc.pid)
        sampler.start()
        idle_mb = tree_rss_mb(op.proc.pid)

        created: dict[str, float] = {}
        sent_at: dict[str, float] = {}
        lock = threading.Lock()
        # What each tuning showed, and when (time.monotonic()), seen through watches (pushed by the
        # API server: polling lists of 100 large statuses lagged by a second on 2 cores).
        first_abs: dict[str, tuple[float, str]] = {}
        queued_abs: dict[str, float] = {}
        done_abs: dict[str, tuple[float, str]] = {}
        stop = threading.Event()

        def seen(obj: dict[str, Any]) -> None:
            key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
            st, now = obj.get("status") or {}, time.monotonic()
            phase = st.get("phase")
            with lock:
                if phase and key not in first_abs:
                    first_abs[key] = (now, phase)
                if phase == "Queued" and st.get("queue") and key not in queued_abs:
                    queued_abs[key] = now
                if phase in TERMINAL and key not in done_abs:
                    done_abs[key] = (now, phase)

        def watcher(ns: str, rv: str) -> None:
            from kubernetes import watch

            while not stop.is_set():
                w = watch.Watch()
                try:
                    for ev in w.stream(custom.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL,
                                       resource_version=rv, timeout_seconds=20):
                        rv = ev["object"]["metadata"]["resourceVersion"]
                        seen(ev["object"])
                        if stop.is_set():
                            w.stop()
                except client.ApiException as exc:  # 410 Gone: start again from a fresh list
                    if exc.status != 410:
                        raise
                    rv = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["metadata"]["resourceVersion"]

        watchers = [threading.Thread(target=watcher, daemon=True, args=(
            ns, custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["metadata"]["resourceVersion"]))
            for ns in namespaces]
        for w in watchers:
            w.start()

        def create(i: int) -> None:
            ns = namespaces[i % len(namespaces)]
            body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ServingTuning",
                    "metadata": {"name": f"t{i}", "namespace": ns}, "spec": spec(i)}
            sent = time.monotonic()
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
            done_at = time.monotonic()
            with lock:
                created[f"{ns}/t{i}"] = done_at  # the object exists once the API server answered
                sent_at[f"{ns}/t{i}"] = sent

        t0 = time.monotonic()
        threads = [threading.Thread(target=create, args=(i,)) for i in range(args.tunings)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        applied_s = time.monotonic() - t0
        while len(done_abs) < args.tunings and time.monotonic() - t0 < args.deadline:
            time.sleep(0.2)
        stop.set()
        # From each tuning's creation (its create call answered); and, an upper bound, from the moment
        # the create was sent (100 creates at once take the API server about a second).
        first = {k: (v[0] - created[k], v[1]) for k, v in first_abs.items() if k in created}
        from_sent = sorted(v[0] - sent_at[k] for k, v in first_abs.items() if k in sent_at) or [float("nan")]
        queued = {k: v - created[k] for k, v in queued_abs.items() if k in created}
        done = {k: (v[0] - t0, v[1]) for k, v in done_abs.items()}
        total_s = max((v[0] for v in done.values()), default=float("nan"))
        sampler.stop_.set()
        sampler.join()
        delays = sorted(v[0] for v in first.values()) or [float("nan")]
        phases: dict[str, int] = {}
        for _, ph in done.values():
            phases[ph] = phases.get(ph, 0) + 1
        import re

        searched = [float(m) for m in re.findall(r"SearchComplete: \d+ candidates in ([0-9.]+) s",
                                                 (tmp / "operator.log").read_text(errors="replace"))]
        quick = sum(1 for ns in namespaces for t in custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
                    ["items"] if ((t.get("status") or {}).get("search") or {}).get("quick"))
        out = {"tunings": args.tunings, "namespaces": args.namespaces, "stage2_top": args.stage2_top,
               "workers": args.workers or "default", "cpus": len(os.sched_getaffinity(0)),
               "applied_s": round(applied_s, 2), "all_terminal_s": round(total_s, 1), "terminal": len(done),
               "phases": phases, "first_phase_s": {"p50": round(statistics.median(delays), 2),
                                                   "max": round(delays[-1], 2)},
               "first_phase_within_2s": sum(1 for d in delays if d <= 2.0),
               "first_phase_from_send_s": {"p50": round(statistics.median(from_sent), 2),
                                           "max": round(from_sent[-1], 2)},
               "queued_with_place": len(queued), "peak_rss_mb": round(sampler.peak), "idle_rss_mb": round(idle_mb),
               "search_s_mean": round(statistics.mean(searched), 2) if searched else None,
               "searches": len(searched), "quick_at_end": quick}
        print(json.dumps(out, indent=2))
        print(f"\n{args.tunings} tunings: all terminal in {total_s:.1f} s ({total_s / 120:.2f}x the 120 s budget; "
              f"430 s before the pool); peak {sampler.peak:.0f} MB operator + search workers "
              f"({sampler.peak / 1024:.2f}x the 1 GB budget); first phase after {statistics.median(delays):.2f} s "
              f"median, {delays[-1]:.2f} s max; {out['first_phase_within_2s']}/{args.tunings} within 2 s")
        if args.json:
            args.json.write_text(json.dumps(out, indent=2))
        return 0 if len(done) == args.tunings else 1
    finally:
        if sampler is not None:
            sampler.stop_.set()
        if op is not None:
            op.stop()
        try:
            for ns in namespaces:
                core.delete_namespace(ns)
        except client.ApiException:
            pass
        if cp is not None:
            cp.stop()


if __name__ == "__main__":
    sys.exit(main())
