"""Real parts for the integration and end-to-end tests: a Kubernetes control plane (scripts/k8s),
a Prometheus (Debian's), the operator as a process, load for emulators, and a kubelet's pod-status
writes. Every wait is bounded in time; everything listens on 127.0.0.1.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "k8s"
T = TypeVar("T")


def wait_until(fn: Callable[[], T | None], timeout: float, what: str, interval: float = 0.25) -> T:
    """Poll ``fn`` until it returns something truthy; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    tries = 0
    while time.monotonic() < deadline and tries < 100_000:
        tries += 1
        try:
            value = fn()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - retried until the deadline, reported then
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}" +
                         (f" (last error: {last_exc!r})" if last_exc else ""))


def skip_or_fail(reason: str) -> None:
    """Skip, saying why; CI sets INFERASIM_REQUIRE_E2E=1 so that a missing part fails instead."""
    import pytest

    if os.environ.get("INFERASIM_REQUIRE_E2E") == "1":
        pytest.fail(f"INFERASIM_REQUIRE_E2E=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------------------------
# Kubernetes control plane
# --------------------------------------------------------------------------------------------


def k8s_bin_dir() -> Path:
    out = subprocess.run(["bash", str(SCRIPTS / "env.sh")], capture_output=True, text=True, check=True).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return Path(env["INFERASIM_K8S_BIN"])


def control_plane_missing() -> str | None:
    """Why the local control plane cannot start here, or None."""
    b = k8s_bin_dir()
    missing = [n for n in ("kube-apiserver", "kube-controller-manager", "kube-scheduler") if not (b / n).exists()]
    if missing:
        return (f"no Kubernetes binaries in {b} ({', '.join(missing)}): run scripts/k8s/build-k8s.sh "
                "(make test-deps), or point INFERASIM_E2E_KUBECONFIG at a cluster")
    if not (os.environ.get("INFERASIM_ETCD") or shutil.which("etcd")):
        return "etcd is not installed (apt-get install etcd-server, or make test-deps)"
    if not shutil.which("kubectl"):
        return "kubectl is not installed"
    return None


class ControlPlane:
    """scripts/k8s/start-k8s.sh in a temp folder; stop() ends exactly its processes."""

    def __init__(self) -> None:
        self.run_dir = Path(tempfile.mkdtemp(prefix="inferasim-k8s-"))
        self.kubeconfig: Path = self.run_dir / "kubeconfig"
        self.started_s = 0.0

    def start(self, crd_dir: Path) -> None:
        t0 = time.monotonic()
        r = subprocess.run(["bash", str(SCRIPTS / "start-k8s.sh"), str(self.run_dir), str(crd_dir)],
                           capture_output=True, text=True, timeout=180)
        if r.returncode != 0:
            raise RuntimeError(f"start-k8s.sh failed ({r.returncode}): {r.stderr[-2000:]}")
        self.started_s = time.monotonic() - t0

    def stop(self) -> None:
        subprocess.run(["bash", str(SCRIPTS / "stop-k8s.sh"), str(self.run_dir)], capture_output=True, timeout=60)


def api_client(kubeconfig: Path | str) -> Any:
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return client.ApiClient(cfg)


def service_account_kubeconfig(api: Any, admin_kubeconfig: Path, namespace: str, sa: str, out: Path) -> Path:
    """A kubeconfig that authenticates as ServiceAccount ``sa`` (TokenRequest API, 1 hour)."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
    try:
        token = core.create_namespaced_service_account_token(sa, namespace, req).status.token
    except client.ApiException:
        # Older clusters: the token Secret the controller-manager creates (read here as admin).
        def secret_name() -> str | None:
            secrets = core.read_namespaced_service_account(sa, namespace).secrets or []
            return secrets[0].name if secrets else None

        name = wait_until(secret_name, 30, f"token Secret of ServiceAccount {namespace}/{sa}")
        import base64

        token = base64.b64decode(core.read_namespaced_secret(name, namespace).data["token"]).decode()
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    ctx = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == ctx["cluster"])
    kc = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster],
          "users": [{"name": sa, "user": {"token": token}}],
          "contexts": [{"name": sa, "context": {"cluster": cluster["name"], "user": sa, "namespace": namespace}}],
          "current-context": sa}
    out.write_text(yaml.safe_dump(kc))
    out.chmod(0o600)
    return out


def register_gpu_node(api: Any, name: str, labels: dict[str, str], resource: str, gpus: int) -> None:
    """A Node object with GPU capacity, Ready, untainted: what the scheduler needs to place pods."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                  **labels}},
            "spec": {}}
    try:
        core.create_node(body)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    cap = {"cpu": "128", "memory": "1Ti", "pods": "110", "ephemeral-storage": "1Ti", resource: str(gpus)}
    status = {"capacity": cap, "allocatable": cap,
              "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test kubelet",
                              "lastHeartbeatTime": now_iso(), "lastTransitionTime": now_iso()}],
              "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
              "nodeInfo": {"kubeletVersion": "v1.20.2", "architecture": "amd64", "operatingSystem": "linux",
                           "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "",
                           "machineID": "", "osImage": "", "systemUUID": ""}}
    core.patch_node_status(name, {"status": status})
    node = core.read_node(name)
    if node.spec.taints:  # the not-ready taint added at registration; the node is Ready now
        core.patch_node(name, {"spec": {"taints": None}})


def _container_statuses(pod: Any, state: dict[str, Any], ready: bool) -> list[dict[str, Any]]:
    return [{"name": c.name, "image": c.image, "imageID": "", "ready": ready, "restartCount": 0,
             "started": ready, "state": state(c.name) if callable(state) else state} for c in pod.spec.containers]


def kubelet_run(api: Any, namespace: str, name: str) -> None:
    """What a kubelet writes when a pod's containers start and pass readiness."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    pod = core.read_namespaced_pod(name, namespace)
    t = now_iso()
    conds = [{"type": k, "status": "True", "lastTransitionTime": t} for k in
             ("Initialized", "Ready", "ContainersReady", "PodScheduled")]
    core.patch_namespaced_pod_status(name, namespace, {"status": {
        "phase": "Running", "conditions": conds, "hostIP": "127.0.0.1", "podIP": "127.0.0.1", "startTime": t,
        "containerStatuses": _container_statuses(pod, {"running": {"startedAt": t}}, True)}})


def kubelet_finish(api: Any, namespace: str, name: str, messages: dict[str, str], exit_code: int = 0) -> None:
    """What a kubelet writes when every container of a pod has exited (with termination messages)."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    pod = core.read_namespaced_pod(name, namespace)
    t = now_iso()

    def state(container: str) -> dict[str, Any]:
        return {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                               "message": messages.get(container, ""), "startedAt": t, "finishedAt": t}}

    conds = [{"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": t},
             {"type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastTransitionTime": t},
             {"type": "Initialized", "status": "True", "lastTransitionTime": t},
             {"type": "PodScheduled", "status": "True", "lastTransitionTime": t}]
    core.patch_namespaced_pod_status(name, namespace, {"status": {
        "phase": "Succeeded" if exit_code == 0 else "Failed", "conditions": conds,
        "containerStatuses": _container_statuses(pod, state, False)}})


# --------------------------------------------------------------------------------------------
# the operator as a process
# --------------------------------------------------------------------------------------------


class OperatorProcess:
    """`python -m inferasim_operator` with a given kubeconfig and settings; logs in a file."""

    def __init__(self, kubeconfig: Path, namespaces: list[str], env: dict[str, str], log: Path) -> None:
        self.kubeconfig, self.namespaces, self.env, self.log = kubeconfig, namespaces, env, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.liveness_port = free_port()
        self.metrics_port = int(env.get("INFERASIM_METRICS_PORT") or 0)

    def start(self) -> None:
        env = {**os.environ, **self.env, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"}
        args = [sys.executable, "-m", "inferasim_operator", "--log-format", "plain",
                "--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz"]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        fh = self.log.open("ab")
        self.proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                     start_new_session=True)
        fh.close()
        wait_until(self.alive_and_healthy, 60, "the operator's liveness endpoint")

    def alive_and_healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited with {self.proc.returncode}: {self.tail()}")
        try:
            return httpx.get(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:  # its own session: the search child processes go too
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


# --------------------------------------------------------------------------------------------
# Prometheus
# --------------------------------------------------------------------------------------------


def prometheus_binary() -> str | None:
    return os.environ.get("INFERASIM_PROMETHEUS") or shutil.which("prometheus")


class Prometheus:
    """A real Prometheus on a free loopback port, scraping the targets of a file_sd file."""

    def __init__(self, workdir: Path, scrape_interval: str = "1s") -> None:
        self.dir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets_file = workdir / "targets.json"
        self.proc: subprocess.Popen[bytes] | None = None
        self.scrape_interval = scrape_interval

    def start(self) -> None:
        binary = prometheus_binary()
        assert binary, "prometheus is not installed"
        self.set_targets([])
        cfg = {"global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
               "scrape_configs": [{"job_name": "engines",
                                   "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": "1s"}]}]}
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        log = (self.dir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen([binary, f"--config.file={self.dir / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={self.dir / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        wait_until(self._ready, 30, "Prometheus /-/ready")

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError("prometheus exited: " + (self.dir / "prometheus.log").read_text()[-1500:])
        try:
            return httpx.get(self.url + "/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def set_targets(self, groups: list[dict[str, Any]]) -> None:
        """[{"targets": ["127.0.0.1:PORT"], "labels": {...}}, ...], replaced atomically."""
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, self.targets_file)

    def query(self, q: str) -> list[dict[str, Any]]:
        r = httpx.get(self.url + "/api/v1/query", params={"query": q}, timeout=5)
        r.raise_for_status()
        return r.json()["data"]["result"]

    def wait_for_series(self, q: str, timeout: float = 40) -> list[dict[str, Any]]:
        return wait_until(lambda: self.query(q), timeout, f"Prometheus series {q}", interval=0.5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@contextmanager
def running_prometheus(prefix: str) -> Iterator[Prometheus]:
    """A started Prometheus in a fresh temp dir, stopped afterwards; skips (or fails under
    INFERASIM_REQUIRE_E2E=1) when the binary is missing."""
    if not prometheus_binary():
        skip_or_fail("prometheus is not installed (apt-get install prometheus, or make test-deps)")
    p = Prometheus(Path(tempfile.mkdtemp(prefix=prefix)))
    p.start()
    try:
        yield p
    finally:
        p.stop()


# --------------------------------------------------------------------------------------------
# load for an emulator
# --------------------------------------------------------------------------------------------


class Load:
    """Completions at about ``rate`` requests/s from a few threads, until stop()."""

    def __init__(self, url: str, model: str, rate: float, prompt_tokens: int, max_tokens: int,
                 threads: int = 4) -> None:
        self.url, self.model, self.rate = url, model, rate
        self.prompt, self.max_tokens = [7] * prompt_tokens, max_tokens
        self._stop = threading.Event()
        self.sent = 0
        self.errors = 0
        self._threads = [threading.Thread(target=self._run, args=(i, threads), daemon=True) for i in range(threads)]

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def _run(self, i: int, n: int) -> None:
        period = n / self.rate
        with httpx.Client(base_url=self.url, timeout=60) as c:
            nxt = time.monotonic() + i * period / n
            while not self._stop.is_set():
                try:
                    r = c.post("/v1/completions", json={"model": self.model, "prompt": self.prompt,
                                                        "max_tokens": self.max_tokens, "ignore_eos": True})
                    self.sent += 1
                    self.errors += int(r.status_code != 200)
                except httpx.HTTPError:
                    self.errors += 1
                nxt += period
                self._stop.wait(max(nxt - time.monotonic(), 0))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=70)


class PhasedLoad:
    """Closed-loop traffic whose load changes over time, as a live deployment's does: ``phases`` of
    (clients, seconds, prompt tokens), cycled until stop(). Prompt and output lengths are drawn
    within +-``spread`` per request: identical lengths keep a closed loop in lockstep waves that no
    live model describes, and one prompt length leaves the prefill cost unidentified. Raw keep-alive
    sockets (the harvester's client): httpx costs milliseconds of CPU per request, which on a small
    loaded host caps the concurrency a Python client reaches."""

    def __init__(self, url: str, model: str, phases: list[tuple[int, float, int]], output_tokens: int = 48,
                 spread: float = 0.25, seed: int = 0) -> None:
        self.url, self.model, self.phases = url, model, phases
        self.osl, self.spread, self.seed = output_tokens, spread, seed
        self.sent = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._t0 = 0.0

    def phase(self) -> tuple[int, int]:
        """(clients, prompt tokens) now."""
        cycle = sum(s for _, s, _ in self.phases)
        t = (time.monotonic() - self._t0) % cycle
        for clients, seconds, isl in self.phases:
            if t < seconds:
                return clients, isl
            t -= seconds
        return self.phases[-1][0], self.phases[-1][2]

    def start(self) -> PhasedLoad:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def _main(self) -> None:
        import asyncio

        asyncio.run(self._run())

    async def _run(self) -> None:
        import asyncio
        import random

        from inferasim.harvest.rawhttp import RawConnection

        async def worker(i: int) -> None:
            rng = random.Random(1000 * self.seed + i)
            conn: RawConnection | None = None
            while not self._stop.is_set():
                clients, isl = self.phase()
                if i >= clients:
                    await asyncio.sleep(0.05)
                    continue
                conn = conn or RawConnection(self.url, 30.0)
                lo, hi = 1 - self.spread, 1 + self.spread
                payload = {"model": self.model, "prompt": [7] * round(isl * rng.uniform(lo, hi)),
                           "max_tokens": round(self.osl * rng.uniform(lo, hi)), "ignore_eos": True}
                try:
                    body = b"".join([c async for c in conn.post_stream("/v1/completions", payload)])
                    ok = b'"completion_tokens":' in body
                    self.sent += int(ok)
                    self.errors += int(not ok)
                except Exception:  # noqa: BLE001 - counted; a new connection next time
                    self.errors += 1
                    conn.close()
                    conn = None
                    await asyncio.sleep(0.1)
            if conn is not None:
                conn.close()

        n = max(c for c, _, _ in self.phases)
        await asyncio.gather(*(worker(i) for i in range(n)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


# --------------------------------------------------------------------------------------------
# the operator, running in a namespace of its own for one test module
# --------------------------------------------------------------------------------------------

GROUP, VERSION, PLURAL = "inferasim.io", "v1alpha1", "servingtunings"
# The ServiceAccount the operator process runs as (conftest.operator_kubeconfig).
OPERATOR_NS = "inferasim-system"
OPERATOR_SA = "inferasim-operator"


def grant_namespace(api: Any, ns: str, *, operator_namespace: bool = False, sa: tuple[str, str] = (OPERATOR_NS,
                                                                                                 OPERATOR_SA)) -> None:
    """What the chart grants the operator's account in a watched namespace (a Role and RoleBinding,
    inferasim_operator.rbac.NAMESPACE_RULES), and in its own namespace (OPERATOR_NAMESPACE_RULES)."""
    from inferasim_operator.rbac import NAMESPACE_RULES, OPERATOR_NAMESPACE_RULES, role, role_binding
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(api)
    sets = [("inferasim-operator", NAMESPACE_RULES)]
    if operator_namespace:
        sets.append(("inferasim-operator-self", OPERATOR_NAMESPACE_RULES))
    for name, rules in sets:
        for create, body in ((rbac.create_namespaced_role, role(name, ns, rules)),
                             (rbac.create_namespaced_role_binding, role_binding(name, ns, *sa))):
            try:
                create(ns, body)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise


@dataclass
class OperatorEnv:
    """A test namespace with an operator process watching it."""

    ns: str
    api: Any
    op: OperatorProcess
    tmp: Path

    @property
    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    def api_groups(self) -> list[Any]:
        """The API groups the server serves (name and versions of each)."""
        from kubernetes import client

        return list(client.ApisApi(self.api).get_api_versions().groups)

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    @property
    def batch(self) -> Any:
        from kubernetes import client

        return client.BatchV1Api(self.api)

    @property
    def apps(self) -> Any:
        from kubernetes import client

        return client.AppsV1Api(self.api)

    def tuning(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def status(self, name: str) -> dict[str, Any]:
        return self.tuning(name).get("status") or {}

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        return next((c for c in self.status(name).get("conditions") or [] if c["type"] == type_), None)

    def apply_tuning(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ServingTuning",
                "metadata": {"name": name, "namespace": self.ns}, "spec": spec}
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, body)


@contextmanager
def operator_in_namespace(api: Any, kubeconfig: Path, prefix: str, env: dict[str, str],
                          log_lines: int = 80) -> Iterator[OperatorEnv]:
    """A fresh namespace `<prefix>-<hex>` (with the chart's Roles for the operator's account) and an
    operator watching only it, with test settings (no
    shipped anchors, a 1 s timer, 3 stage-2 candidates, short backoff) updated by `env`; on exit the
    operator stops, its log tail is printed, and the namespace is deleted."""
    import uuid

    from kubernetes import client

    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": ns}})
    # The chart's Roles: the namespace is watched, and it is the operator's own (prices, harvest locks).
    grant_namespace(api, ns, operator_namespace=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"inferasim-{prefix}-"))
    (tmp / "anchors").mkdir()
    settings = {
        "INFERASIM_ANCHOR_DIRS": str(tmp / "anchors"), "INFERASIM_ANCHOR_CACHE": str(tmp / "anchor-cache"),
        "INFERASIM_TIMER_SECONDS": "1", "INFERASIM_DRIFT_CHECK_SECONDS": "3600", "INFERASIM_STAGE2_TOP": "3",
        "INFERASIM_SEARCH_TIMEOUT_S": "240", "INFERASIM_BACKOFF_BASE_S": "1", "INFERASIM_BACKOFF_MAX_S": "5",
        "INFERASIM_METRICS_PORT": str(free_port()), "INFERASIM_METRICS_ADDR": "127.0.0.1",
        "INFERASIM_OPERATOR_NAMESPACE": ns,  # the prices ConfigMap is looked up here
        **env,
    }
    op = OperatorProcess(kubeconfig, [ns], settings, tmp / "operator.log")
    op.start()
    try:
        yield OperatorEnv(ns, api, op, tmp)
    finally:
        op.stop()
        print(f"\n--- operator log (tail) ---\n{op.tail(log_lines)}")
        try:
            core.delete_namespace(ns)
        except client.ApiException:
            pass
