"""Fuzz on the real control plane: over 300 ServingTuning specs generated from the CRD's own
schema (hypothesis + hypothesis-jsonschema), some grounded on models and GPUs the catalog knows so
that they reach the search, plus hand-written hostile values. Each is sent to the API server as
is; for every one it accepts, the operator (a process under the chart's RBAC) must write a
condition, it must stay alive, and its log must hold no traceback.

Deterministic (derandomized): the same specs on every run. Runtime: a few minutes at most (short
search and observation limits, one stage-2 candidate, small GPU budgets for the grounded specs).
"""

from __future__ import annotations

import copy
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from inferasim_e2e_support import GROUP, PLURAL, REPO, VERSION, OperatorEnv, operator_in_namespace, wait_until

pytestmark = pytest.mark.e2e

N_SCHEMA = 185  # straight from the schema
N_GROUNDED = 80  # from the schema, with a known model, GPU and a small GPU budget
MODELS = ["meta-llama/Meta-Llama-3-8B", "Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-0.6B"]
GPUS = ["MI300X", "MI355X", "H100", "H200", "AMD_Instinct_MI300X_OAM"]
BASE = {"target": {"name": "chat"}, "model": "meta-llama/Meta-Llama-3-8B", "hardware": {"gpu": "MI300X", "maxGPUs": 2},
        "engines": ["vllm"], "workload": {"static": {"kind": "poisson", "requestRate": 2, "inputTokens": 256,
                                                     "outputTokens": 64}}}


def crd_spec_schema() -> dict[str, Any]:
    """The CRD's spec schema as a JSON Schema (draft 4: OpenAPI v3's boolean exclusive bounds),
    without the Kubernetes extensions."""
    crd = yaml.safe_load((REPO / "crds" / "servingtunings.inferasim.io.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]

    def clean(s: Any) -> Any:
        if isinstance(s, dict):
            return {k: clean(v) for k, v in s.items()
                    if not k.startswith("x-kubernetes-") and k not in ("nullable", "description", "format")}
        if isinstance(s, list):
            return [clean(v) for v in s]
        return s

    return {"$schema": "http://json-schema.org/draft-04/schema#", **clean(spec)}


def generated_specs() -> list[tuple[str, dict[str, Any]]]:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from hypothesis_jsonschema import from_schema

    full = crd_spec_schema()
    schema = from_schema(full)
    def part(*path: str) -> Any:
        sub = full
        for key in path:
            sub = sub["properties"][key]
        return from_schema({"$schema": full["$schema"], **sub})

    static = part("workload", "static")
    # The optional sections drawn on their own (the whole schema's draws leave them out mostly).
    sections = st.fixed_dictionaries({}, optional={k: part(k) for k in ("objective", "harvest", "confirmation",
                                                                        "retune", "engines", "precision")})
    out: list[tuple[str, dict[str, Any]]] = []

    def grounded(spec: dict[str, Any], extra: dict[str, Any], workload: dict[str, Any], model: str, gpu: str,
                 gpus: int) -> dict[str, Any]:
        spec = {**copy.deepcopy(spec), **extra}
        spec["model"] = model
        # Drawn fields over a servable workload (a bare draw is mostly `{}`, refused before any search).
        spec["workload"] = {"static": {**BASE["workload"]["static"], **workload}}
        spec["hardware"] = {**(spec.get("hardware") or {}), "gpu": gpu, "maxGPUs": gpus, "gpusPerNode": 8}
        spec.pop("search", None)  # its knobs can make a space that no short time limit covers
        return spec

    common = dict(database=None, deadline=None, derandomize=True, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))

    @settings(max_examples=N_SCHEMA, **common)
    @given(schema)
    def raw(spec: dict[str, Any]) -> None:
        out.append(("schema", spec))

    @settings(max_examples=N_GROUNDED, **common)
    @given(schema, sections, static, st.sampled_from(MODELS), st.sampled_from(GPUS), st.integers(1, 8))
    def known(spec: dict[str, Any], extra: dict[str, Any], workload: dict[str, Any], model: str, gpu: str,
              gpus: int) -> None:
        out.append(("grounded", grounded(spec, extra, workload, model, gpu, gpus)))

    raw()
    known()
    return out


def hostile_specs() -> list[tuple[str, dict[str, Any]]]:
    """Values an attacker (or a careless script) sends: paths, huge and tiny numbers, long strings,
    odd unicode, injections into the PromQL selector and the engine images."""
    def with_(**over: Any) -> dict[str, Any]:
        s = copy.deepcopy(BASE)
        for path, value in over.items():
            node = s
            keys = path.split("__")
            for k in keys[:-1]:
                node = node.setdefault(k, {})
            node[keys[-1]] = value
        return s

    prom = {"url": "http://127.0.0.1:1", "selector": {"namespace": "x"}, "window": "1m"}
    cases = {
        "model-path": with_(model="/etc/passwd"), "model-proc": with_(model="/proc/self/environ"),
        "model-dotdot": with_(model="../../../../root/.kube/config"), "model-file-url": with_(model="file:///etc/shadow"),
        "model-home": with_(model="~/.kube/config"), "model-long": with_(model="a/" + "b" * 100_000),
        "model-nul": with_(model="meta-llama/Meta-Llama-3-8B\u0000"), "model-rtl": with_(model="\u202eB8-3-amall"),
        "model-emoji": with_(model="🦙/🦙"), "model-empty": with_(model=""),
        "slo-tiny": with_(objective={"slo": {"ttftP90Ms": 1e-300}}),
        "slo-12": with_(objective={"slo": {"ttftP90Ms": 12}}),
        "slo-huge": with_(objective={"slo": {"ttftP90Ms": 1e308, "itlP90Ms": 1e308}}),
        "rate-huge": with_(workload__static__requestRate=1e308),
        "rate-tiny": with_(workload__static__requestRate=1e-308),
        "tokens-huge": with_(workload__static__inputTokens=2**62),
        "gpus-huge": with_(hardware={"gpu": "MI300X", "maxGPUs": 2**31}),
        "gpu-unknown": with_(hardware={"gpu": "NotAGPU\u0000", "maxGPUs": 1}),
        "window-digits": with_(confirmation={"mode": "canary", "window": "9" * 5000 + "m"}),
        "window-year": with_(confirmation={"mode": "canary", "window": "99999999d"}),
        "retune-garbage": with_(retune={"every": "'; DROP TABLE tunings; --"}),
        "selector-2000": with_(workload={"prometheus": {**prom, "selector": {f"l{i}": "v" for i in range(2000)}}}),
        "selector-inject": with_(workload={"prometheus": {**prom, "selector": {"namespace": 'x"} or vector(1) #'}}}),
        "selector-badkey": with_(workload={"prometheus": {**prom, "selector": {"a b": "c", "__name__": "x"}}}),
        "prom-url-file": with_(workload={"prometheus": {**prom, "url": "file:///etc/passwd"}}),
        "prom-url-long": with_(workload={"prometheus": {**prom, "url": "http://" + "a" * 70_000}}),
        "tolerations-weird": with_(harvest={"allowed": True, "tolerations": [{"weird": 1}]}),
        "tolerations-typed-bad": with_(harvest={"allowed": True, "tolerations": [{"operator": "Exists",
                                                                                 "effect": "Explode"}]}),
        "images-inject": with_(harvest={"allowed": True, "images": {"vllm": "x; rm -rf / #"}}),
        "images-unknown-engine": with_(harvest={"allowed": True, "images": {"trtllm": "x"}}),
        "node-selector-long": with_(harvest={"allowed": True, "nodeSelector": {"k" * 400: "v"}}),
        "gpu-hours-neg": with_(harvest={"allowed": True, "maxGPUHours": -1}),
        "gpu-hours-inf-ish": with_(harvest={"allowed": True, "maxGPUHours": 1e308}),
        "target-long": with_(target={"name": "t" * 300}), "target-kind": with_(target={"name": "x", "kind": "Pod"}),
        "engines-dup": with_(engines=["vllm", "vllm", "sglang", "atom"]),
        "precision-odd": with_(precision=["fp3", "bf16"]), "trace": with_(workload={"trace": {"path": "/etc/passwd"}}),
        "deep-unknown": with_(extra={"a": {"b": {"c": [1, 2, {"d": "e" * 1000}]}}}),
        "canaries-max": with_(confirmation={"mode": "canary", "candidates": 5, "window": "1m"}),
    }
    return [(f"hostile:{k}", v) for k, v in cases.items()]


@pytest.fixture(scope="module")
def env(cluster: Any, operator_kubeconfig: Path) -> Iterator[OperatorEnv]:
    settings = {"INFERASIM_SEARCH_TIMEOUT_S": "20", "INFERASIM_SEARCH_MAX_FAILURES": "1", "INFERASIM_STAGE2_TOP": "1",
                "INFERASIM_OBSERVE_TIMEOUT_S": "2", "INFERASIM_TIMER_SECONDS": "5", "INFERASIM_BACKOFF_BASE_S": "5",
                "INFERASIM_BACKOFF_MAX_S": "60", "INFERASIM_SEARCH_WORKERS": "2"}
    with operator_in_namespace(cluster.api, operator_kubeconfig, "fuzz", settings, log_lines=30) as e:
        yield e


def test_fuzzed_specs_never_crash_or_silence_the_operator(env: OperatorEnv) -> None:
    from kubernetes import client

    specs = generated_specs() + hostile_specs()
    assert len(specs) >= 300
    accepted: dict[str, str] = {}
    refused: Counter[str] = Counter()
    t0 = time.monotonic()
    for i, (kind, spec) in enumerate(specs):
        name = f"fz-{i}"
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ServingTuning",
                "metadata": {"name": name, "namespace": env.ns}, "spec": spec}
        try:
            env.custom.create_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL, body)
            accepted[name] = kind
        except client.ApiException as exc:
            assert exc.status < 500 or exc.status == 500 and "Invalid" in str(exc.body), (kind, exc.status, exc.body)
            refused[f"{kind.split(':')[0]} HTTP {exc.status}"] += 1
        except ValueError:  # the client itself refuses to send it (a NUL in a header-bound value ...)
            refused[f"{kind.split(':')[0]} client"] += 1
    created_s = time.monotonic() - t0

    def without_condition() -> list[str]:
        items = env.custom.list_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL)["items"]
        have = {t["metadata"]["name"] for t in items if (t.get("status") or {}).get("conditions")}
        return sorted(set(accepted) - have)

    missing: list[str] = []

    def all_have_conditions() -> bool:
        nonlocal missing
        assert env.op.proc is not None and env.op.proc.poll() is None, env.op.tail()
        missing = without_condition()
        return not missing

    try:
        wait_until(all_have_conditions, 420, "a condition on every accepted tuning", interval=1.0)
    except AssertionError:
        raise AssertionError(f"{len(missing)} accepted tunings without a condition: "
                             f"{[(n, accepted[n]) for n in missing[:20]]}") from None
    waited_s = time.monotonic() - t0 - created_s

    # Then until the search pool has drained (every search run, or given up): what the searches of
    # the fuzzed specs do must not crash or silence the operator either.
    def settled() -> bool:
        assert env.op.proc is not None and env.op.proc.poll() is None, env.op.tail()
        items = env.custom.list_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL)["items"]
        return not [t for t in items if (t.get("status") or {}).get("phase") in ("Queued", "Searching")]

    wait_until(settled, 420, "the search queue drained", interval=2.0)
    settled_s = time.monotonic() - t0 - created_s
    # Alive, healthy, and never a traceback in its log.
    assert env.op.proc is not None and env.op.proc.poll() is None
    assert httpx.get(f"http://127.0.0.1:{env.op.liveness_port}/healthz", timeout=5).status_code == 200
    log = env.op.log.read_text(errors="replace")
    assert "Traceback" not in log, log[log.index("Traceback") - 2000:log.index("Traceback") + 3000]
    items = env.custom.list_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL)["items"]
    phases = Counter((t.get("status") or {}).get("phase", "-") for t in items)
    reasons = Counter(c["reason"] for t in items for c in (t.get("status") or {}).get("conditions") or []
                      if c["type"] in ("Recommended", "WorkloadObserved", "Degraded") and c["status"] != "True")
    by_kind = Counter(k.split(":")[0] for k in accepted.values())
    print(f"\nfuzz: {len(specs)} specs ({dict(Counter(k.split(':')[0] for k, _ in specs))}); accepted "
          f"{len(accepted)} ({dict(by_kind)}), refused {sum(refused.values())} ({dict(refused)}); created in "
          f"{created_s:.0f} s, all with a condition {waited_s:.0f} s later, queue drained after {settled_s:.0f} s; "
          f"phases {dict(phases)}; "
          f"reasons {dict(reasons.most_common(8))}")
    assert by_kind["grounded"] >= 10 and phases["Recommended"] + phases["Failed"] >= 1, (by_kind, phases)
    # A recommendation is never published with zero or non-finite throughput.
    for t in items:
        rec = (t.get("status") or {}).get("recommendation")
        if rec:
            assert rec["predicted"]["throughputPerGpu"] > 0, (t["metadata"]["name"], rec["predicted"])
    json.dumps(items)  # what the API server holds is plain JSON (no inf, no nan)
