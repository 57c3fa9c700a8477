"""Issue 27 items 3 and 4: P/D manifests with the engine's router, pod options, benchmark Jobs; every
rendered object validated offline against the Kubernetes OpenAPI definitions (tests/data/k8s-openapi)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from inferasim.core.config import ServingConfig
from inferasim.core.engine_args import HF_HOME
from inferasim.core.layout import Layout
from inferasim.core.spec import DeploySpec, SpecError, parse_spec
from inferasim.render import ANNOTATION_PD_ROUTER, LABEL_NAME, render_manifests
from inferasim.render_bench import BenchWorkload, render_bench_job
from inferasim.render_pd import pd_router_gap, render_pd_manifests
from inferasim.render_pod import RenderOptions

DEFINITIONS = Path(__file__).resolve().parent.parent / "data" / "k8s-openapi" / "definitions.json"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ENGINES = [("vllm", "H200"), ("sglang", "MI300X"), ("atom", "MI355X")]
FULL = RenderOptions(model_cache_pvc="models", offline=True, rdma_resource="rdma/hca_shared_devices_a", rdma_count=2,
                     router_image="registry.local/router:1")


# --------------------------------------------------------------------------------------------------
# The schema
# --------------------------------------------------------------------------------------------------


@cache
def _definitions() -> dict[str, Any]:
    defs = copy.deepcopy(json.loads(DEFINITIONS.read_text())["definitions"])
    for d in defs.values():
        # Kubernetes object schemas list every field: anything else is a typo that the API server's strict
        # field validation refuses (and older servers drop without a word).
        if d.get("type") == "object" and "properties" in d and "additionalProperties" not in d:
            d["additionalProperties"] = False
    # swagger spells IntOrString as a string of format int-or-string; JSON carries either.
    defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["integer", "string"]}
    return defs


def validate(obj: dict[str, Any]) -> None:
    kinds = {}
    for name, d in _definitions().items():
        for gvk in d.get("x-kubernetes-group-version-kind", []):
            kinds[(f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"], gvk["kind"])] = name
    key = (obj.get("apiVersion"), obj.get("kind"))
    assert key in kinds, f"no vendored schema for {key}: add its definitions to tests/data/k8s-openapi"
    jsonschema.Draft4Validator({"$ref": f"#/definitions/{kinds[key]}", "definitions": _definitions()}).validate(obj)


def _pools(engine: str, gpu: str, prefill_pods: int = 1, decode_pods: int = 1) -> tuple[ServingConfig, ServingConfig]:
    common = dict(engine=engine, model=MODEL, gpu=gpu)
    return (ServingConfig(layout=Layout(tp=1), replicas=prefill_pods, disagg_role="prefill", **common),
            ServingConfig(layout=Layout(tp=2), replicas=decode_pods, disagg_role="decode", **common))


def _all_rendered() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for engine, gpu in ENGINES:
        cfg = ServingConfig(engine=engine, model=MODEL, gpu=gpu, layout=Layout(tp=2), replicas=2)
        for opts in (RenderOptions(), FULL, RenderOptions(runtime_class_name="nvidia") if gpu == "H200"
                     else RenderOptions(rocm_render_gid=110)):
            out += [(f"{engine} colocated", m) for m in render_manifests(cfg, "llm", "serving", opts)]
            out += [(f"{engine} P/D", m) for m in render_pd_manifests(*_pools(engine, gpu), "llm", "serving", opts)]
            out.append((f"{engine} bench", render_bench_job(cfg, "llm", "llm-bench",
                                                            BenchWorkload(1000, 200, 2.5, 500), "serving", opts)))
    return out


def test_the_vendored_schema_refuses_what_the_api_server_refuses() -> None:
    """The check can fail: a misspelt field, a wrong type and a missing required field are refused."""
    dep = render_manifests(ServingConfig(engine="vllm", model=MODEL, gpu="H200", layout=Layout(tp=1)), "x")[0]
    validate(dep)
    typo = copy.deepcopy(dep)
    typo["spec"]["template"]["spec"]["runtimeClass"] = "nvidia"
    with pytest.raises(jsonschema.ValidationError, match="runtimeClass"):
        validate(typo)
    wrong = copy.deepcopy(dep)
    wrong["spec"]["replicas"] = "2"
    with pytest.raises(jsonschema.ValidationError):
        validate(wrong)
    missing = copy.deepcopy(dep)
    del missing["spec"]["template"]["spec"]["containers"][0]["name"]
    with pytest.raises(jsonschema.ValidationError, match="name"):
        validate(missing)


def test_a_leader_worker_set_holds_valid_pod_templates() -> None:
    """LeaderWorkerSet is a CRD (no vendored schema): its leader and worker templates are checked as
    core/v1 PodTemplateSpecs, its own fields as the LWS v1 API writes them."""
    cfg = ServingConfig(engine="sglang", model="meta-llama/Llama-3.1-405B-Instruct", gpu="MI300X",
                        layout=Layout(tp=16), replicas=2)
    lws = render_manifests(cfg, "big", "serving", FULL)[0]
    assert set(lws) == {"apiVersion", "kind", "metadata", "spec"} and set(lws["spec"]) == {"replicas",
                                                                                          "leaderWorkerTemplate"}
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert set(lwt) == {"size", "restartPolicy", "leaderTemplate", "workerTemplate"} and lwt["size"] == 2
    template = {"$ref": "#/definitions/io.k8s.api.core.v1.PodTemplateSpec", "definitions": _definitions()}
    for t in (lwt["leaderTemplate"], lwt["workerTemplate"]):
        jsonschema.Draft4Validator(template).validate(t)
    broken = copy.deepcopy(lwt["workerTemplate"])
    broken["spec"]["containers"][0]["args"] = "--tp-size 16"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(template).validate(broken)


def test_every_rendered_object_is_valid_kubernetes() -> None:
    rendered = _all_rendered()
    kinds = {m["kind"] for _, m in rendered}
    assert kinds == {"Deployment", "Service", "PodDisruptionBudget", "ServiceAccount", "Role", "RoleBinding", "Job"}
    for what, m in rendered:
        try:
            validate(m)
        except jsonschema.ValidationError as exc:  # pragma: no cover - the message is the point
            raise AssertionError(f"{what} {m['kind']} {m['metadata']['name']}: {exc.message} at "
                                 f"{list(exc.absolute_path)}") from None
        yaml.safe_load(yaml.safe_dump(m))  # and YAML round-trips


# --------------------------------------------------------------------------------------------------
# P/D (item 3)
# --------------------------------------------------------------------------------------------------


def _by(ms: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(m for m in ms if m["kind"] == kind and m["metadata"]["name"] == name)


def _container(dep: dict[str, Any]) -> dict[str, Any]:
    return dep["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("engine,gpu", ENGINES[:2])
def test_the_router_discovers_exactly_the_two_pools(engine: str, gpu: str) -> None:
    ms = render_pd_manifests(*_pools(engine, gpu, 2, 3), "chat", "serving")
    router = _container(_by(ms, "Deployment", "chat-router"))
    argv = router["command"] + router["args"]
    assert ("--vllm-pd-disaggregation" if engine == "vllm" else "--pd-disaggregation") in " ".join(argv)
    for role in ("prefill", "decode"):
        selector = argv[argv.index(f"--{role}-selector") + 1]
        key, value = selector.split("=")
        pool = _by(ms, "Deployment", f"chat-{role}")
        assert pool["spec"]["template"]["metadata"]["labels"][key] == value  # its pods, and only its pods
        assert "router Deployment chat-router" in pool["metadata"]["annotations"][ANNOTATION_PD_ROUTER]
    assert argv[argv.index("--service-discovery-namespace") + 1] == "serving"
    port = router["ports"][0]["containerPort"]
    assert argv[argv.index("--service-discovery-port") + 1] == str(port)
    assert argv[argv.index("--port") + 1] == str(port)
    # Clients use Service chat; it selects the router's pods, on the engine's port.
    svc = _by(ms, "Service", "chat")
    assert svc["spec"]["selector"] == {LABEL_NAME: "chat-router"} and svc["spec"]["ports"][0]["port"] == port
    # The discovery reads pods: its ServiceAccount may get, list and watch them, nothing else.
    assert _by(ms, "Deployment", "chat-router")["spec"]["template"]["spec"]["serviceAccountName"] == "chat-router"
    assert _by(ms, "Role", "chat-router")["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                                                       "verbs": ["get", "list", "watch"]}]


def test_kv_transfer_flags_and_ports_per_engine() -> None:
    vllm = render_pd_manifests(*_pools("vllm", "H200"), "v")
    for role in ("prefill", "decode"):
        c = _container(_by(vllm, "Deployment", f"v-{role}"))
        cfg = json.loads(c["args"][c["args"].index("--kv-transfer-config") + 1])
        assert cfg["kv_connector"] == "NixlConnector"
        assert {"name": "nixl-side", "containerPort": 5600, "protocol": "TCP"} in c["ports"]
        assert {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "5600"} in c["env"]
        assert any(p["name"] == "nixl-side" for p in _by(vllm, "Service", f"v-{role}")["spec"]["ports"])
    sgl = render_pd_manifests(*_pools("sglang", "MI300X"), "s", options=RenderOptions(kv_transfer_backend="nixl"))
    pre, dec = _by(sgl, "Deployment", "s-prefill"), _by(sgl, "Deployment", "s-decode")
    for dep, role in ((pre, "prefill"), (dec, "decode")):
        args = _container(dep)["args"]
        assert args[args.index("--disaggregation-mode") + 1] == role
        assert args[args.index("--disaggregation-transfer-backend") + 1] == "nixl"
    pre_args = _container(pre)["args"]
    assert pre_args[pre_args.index("--disaggregation-bootstrap-port") + 1] == "8998"
    assert {"name": "bootstrap", "containerPort": 8998, "protocol": "TCP"} in _container(pre)["ports"]
    assert pre["spec"]["template"]["metadata"]["annotations"]["sglang.ai/bootstrap-port"] == "8998"
    assert "--disaggregation-bootstrap-port" not in _container(dec)["args"]
    # Pool Services are headless: one DNS record per pod.
    assert _by(sgl, "Service", "s-prefill")["spec"]["clusterIP"] == "None"


def test_rdma_and_ipc_lock_only_on_pd_pods() -> None:
    opts = RenderOptions(rdma_resource="rdma/hca_shared_devices_a", rdma_count=2)
    for dep in (m for m in render_pd_manifests(*_pools("vllm", "H200"), "v", options=opts)
                if m["kind"] == "Deployment" and m["metadata"]["name"] != "v-router"):
        c = _container(dep)
        assert c["resources"]["requests"]["rdma/hca_shared_devices_a"] == "2"
        assert c["resources"]["limits"]["rdma/hca_shared_devices_a"] == "2"
        assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]
    colocated = _container(render_manifests(ServingConfig(engine="vllm", model=MODEL, gpu="H200",
                                                          layout=Layout(tp=1)), "c", options=opts)[0])
    assert "rdma/hca_shared_devices_a" not in colocated["resources"]["requests"]
    assert "securityContext" not in colocated


def test_atom_router_for_one_pod_per_pool_and_a_clear_gap_beyond() -> None:
    ms = render_pd_manifests(*_pools("atom", "MI355X"), "a", "ns")
    router = _container(_by(ms, "Deployment", "a-router"))
    assert router["command"] == ["atomesh"]
    args = router["args"]
    assert args[args.index("--prefill") + 1:args.index("--prefill") + 3] == ["http://a-prefill.ns.svc:8000", "6301"]
    assert args[args.index("--decode") + 1] == "http://a-decode.ns.svc:8000"
    assert {"name": "kv-handshake", "containerPort": 6301, "protocol": "TCP"} in \
        _container(_by(ms, "Deployment", "a-prefill"))["ports"]
    gap = pd_router_gap("atom", 2, 1)
    assert gap is not None and "no router is rendered" in gap
    ms = render_pd_manifests(*_pools("atom", "MI355X", 2, 1), "a", "ns")
    assert not any(m["metadata"]["name"] == "a-router" for m in ms)
    assert _by(ms, "Deployment", "a-prefill")["metadata"]["annotations"][ANNOTATION_PD_ROUTER] == gap
    assert pd_router_gap("vllm", 8, 8) is None and pd_router_gap("sglang", 8, 8) is None


def test_an_offline_vllm_pd_deployment_needs_a_router_image() -> None:
    offline = RenderOptions(model_cache_pvc="models", offline=True)
    with pytest.raises(ValueError, match="router-image"):
        render_pd_manifests(*_pools("vllm", "H200"), "v", options=offline)
    ms = render_pd_manifests(*_pools("vllm", "H200"), "v", options=RenderOptions(
        model_cache_pvc="models", offline=True, router_image="registry.local/vllm-router:0.1.17"))
    router = _container(_by(ms, "Deployment", "v-router"))
    assert router["image"] == "registry.local/vllm-router:0.1.17" and router["command"] == ["vllm-router"]


def test_pd_refuses_mismatched_pools_naming_the_field() -> None:
    p, d = _pools("vllm", "H200")
    with pytest.raises(ValueError, match="disagg_role prefill and decode"):
        render_pd_manifests(d, p, "x")
    other = ServingConfig(engine="vllm", model="Qwen/Qwen3-8B", gpu="H200", layout=Layout(tp=1), disagg_role="decode")
    with pytest.raises(ValueError, match="differ in model"):
        render_pd_manifests(p, other, "x")
    with pytest.raises(ValueError, match="at most 55 characters"):
        render_pd_manifests(p, d, "a" * 60)


# --------------------------------------------------------------------------------------------------
# Pod options (item 4)
# --------------------------------------------------------------------------------------------------


def test_model_cache_pvc_is_mounted_where_hf_home_points_and_offline_loads_from_it() -> None:
    dep = render_manifests(ServingConfig(engine="sglang", model=MODEL, gpu="MI300X", layout=Layout(tp=1)), "m",
                           options=FULL)[0]
    c, pod = _container(dep), dep["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == env["HF_HOME"] == HF_HOME)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert mount["readOnly"] is True
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    online = render_manifests(ServingConfig(engine="sglang", model=MODEL, gpu="MI300X", layout=Layout(tp=1)), "m",
                              options=RenderOptions(model_cache_pvc="models"))[0]
    assert "HF_HUB_OFFLINE" not in {e["name"] for e in _container(online)["env"]}
    assert {"claimName": "models", "readOnly": False} in [v.get("persistentVolumeClaim") for v in
                                                          online["spec"]["template"]["spec"]["volumes"]]


def test_rocm_pods_get_groups_and_seccomp_nvidia_pods_the_runtime_class() -> None:
    amd = render_manifests(ServingConfig(engine="vllm", model=MODEL, gpu="MI300X", layout=Layout(tp=1)), "a",
                           options=RenderOptions(rocm_render_gid=110))[0]["spec"]["template"]["spec"]
    assert amd["securityContext"]["supplementalGroups"] == [44, 110]
    env = {e["name"]: e.get("value") for e in amd["containers"][0]["env"]}
    assert env["HIP_FORCE_DEV_KERNARG"] == "1" and env["VLLM_ROCM_USE_AITER"] == "1"
    assert amd["containers"][0]["securityContext"]["seccompProfile"] == {"type": "Unconfined"}
    assert "runtimeClassName" not in amd
    nv = render_manifests(ServingConfig(engine="vllm", model=MODEL, gpu="H200", layout=Layout(tp=1)), "n",
                          options=RenderOptions(runtime_class_name="nvidia"))[0]["spec"]["template"]["spec"]
    assert nv["runtimeClassName"] == "nvidia" and "securityContext" not in nv
    assert "HIP_FORCE_DEV_KERNARG" not in {e["name"] for e in nv["containers"][0]["env"]}
    with pytest.raises(ValueError, match="NVIDIA container runtime option"):
        render_manifests(ServingConfig(engine="vllm", model=MODEL, gpu="MI300X", layout=Layout(tp=1)), "a",
                         options=RenderOptions(runtime_class_name="nvidia"))


def test_memory_limit_equals_request_and_a_pdb_guards_each_deployment() -> None:
    ms = render_manifests(ServingConfig(engine="vllm", model=MODEL, gpu="H200", layout=Layout(tp=2), replicas=3), "p")
    res = _container(ms[0])["resources"]
    assert res["limits"]["memory"] == res["requests"]["memory"]
    pdb = _by(ms, "PodDisruptionBudget", "p")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": ms[0]["spec"]["selector"]["matchLabels"]}}
    assert [m["kind"] for m in render_manifests(ServingConfig(engine="vllm", model=MODEL, gpu="H200",
                                                              layout=Layout(tp=1)), "p",
                                                options=RenderOptions(pod_disruption_budget=False))] == \
        ["Deployment", "Service"]


def test_deploy_spec_fields_are_bounded_and_explained() -> None:
    base = {"model": MODEL, "hardware": {"gpu": "H200"}, "workload": {"static": {"requestRate": 1}}}
    spec = parse_spec({**base, "deploy": {"modelCachePVC": "models", "offline": True, "rdmaResource": "rdma/a"}})
    assert RenderOptions.from_spec(spec.deploy).model_cache_pvc == "models"
    for bad, field in (({"offline": True}, "modelCachePVC"), ({"modelCachePVC": "Bad_Name"}, "modelCachePVC"),
                       ({"rdmaResource": "nodomain"}, "rdmaResource"), ({"rdmaCount": 0}, "rdmaCount"),
                       ({"kvTransferBackend": "tcp"}, "kvTransferBackend"), ({"rocmRenderGID": -1}, "rocmRenderGID")):
        with pytest.raises(SpecError, match=field.replace("GID", "GID")):
            parse_spec({**base, "deploy": bad})
    for name, f in DeploySpec.model_fields.items():  # every string bounded, every number bounded
        schema = DeploySpec.model_json_schema()["properties"][f.alias or name]
        text = json.dumps(schema)
        assert "maxLength" in text or "maximum" in text or "enum" in text or '"boolean"' in text, name


# --------------------------------------------------------------------------------------------------
# Benchmark Jobs (item 4)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine,gpu", ENGINES)
def test_the_bench_job_runs_the_engines_client_at_the_workload(engine: str, gpu: str) -> None:
    cfg = ServingConfig(engine=engine, model=MODEL, gpu=gpu, layout=Layout(tp=1))
    job = render_bench_job(cfg, "llm", "llm-bench", BenchWorkload(3000, 150, 4.5, 900), "serving")
    c = _container(job)
    argv = c["args"]
    want = {"vllm": ["vllm", "bench", "serve"], "sglang": ["python3", "-m", "sglang.bench_serving"],
            "atom": ["vllm", "bench", "serve"]}[engine]
    assert argv[:len(want)] == want
    port = {"vllm": 8000, "sglang": 30000, "atom": 8000}[engine]
    assert argv[argv.index("--base-url") + 1] == f"http://llm.serving.svc:{port}"
    assert argv[argv.index("--random-input-len") + 1] == "3000"
    assert argv[argv.index("--random-output-len") + 1] == "150"
    assert argv[argv.index("--request-rate") + 1] == "4.5"
    assert argv[argv.index("--num-prompts") + 1] == "900"
    assert argv[argv.index("--model") + 1] == MODEL
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    assert "/health" in c["command"][2]  # waits for the server before the clock starts


def test_bench_workload_bounds() -> None:
    for bad in (dict(input_tokens=0), dict(output_tokens=10**8), dict(request_rate=0.0),
                dict(request_rate=float("inf")), dict(num_requests=True)):
        kw = dict(input_tokens=10, output_tokens=10, request_rate=1.0, num_requests=10) | bad
        with pytest.raises(ValueError, match="benchmark"):
            BenchWorkload(**kw)


def test_render_cli_pd_with_bench(tmp_path: Path) -> None:
    out = tmp_path / "pd.yaml"
    r = subprocess.run([sys.executable, "-m", "inferasim", "render", "--model", MODEL, "--gpu", "H200", "--engine",
                        "vllm", "--pd", "P2xtp1+D1xtp2", "--bench", "--bench-rate", "3", "--model-cache-pvc", "hf",
                        "--runtime-class", "nvidia", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all(out.read_text()))
    for d in docs:
        validate(d)
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Deployment", "llm-router"), ("Service", "llm"), ("Deployment", "llm-prefill"),
            ("Deployment", "llm-decode"), ("Job", "llm-bench")} <= names
    assert _by(docs, "Deployment", "llm-prefill")["spec"]["replicas"] == 2
    bad = subprocess.run([sys.executable, "-m", "inferasim", "render", "--model", MODEL, "--gpu", "H200", "--engine",
                          "vllm", "--pd", "P2xtp1", "--offline"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "--model-cache-pvc" in bad.stderr or "PxLAYOUT+DxLAYOUT" in bad.stderr


# --------------------------------------------------------------------------------------------------
# tune: the P/D recommendation deploys whole; a benchmark Job per short-listed configuration
# --------------------------------------------------------------------------------------------------


def test_tune_renders_the_router_with_the_spec_deploy_options_and_writes_bench_jobs() -> None:
    from inferasim.cli.tune import bench_jobs
    from inferasim.search.deploy import recommendation_manifests
    from inferasim.search.tune import tune

    spec = parse_spec({"model": MODEL, "hardware": {"gpu": "H100", "gpusPerNode": 8, "maxGPUs": 4},
                       "engines": ["vllm"],
                       "workload": {"static": {"requestRate": 4, "inputTokens": 2000, "outputTokens": 200,
                                               "numRequests": 300}},
                       "search": {"maxNumSeqs": [64], "maxNumBatchedTokens": [8192], "chunkedPrefill": [True],
                                  "disaggregation": True},
                       "deploy": {"modelCachePVC": "models", "runtimeClassName": "nvidia"}})
    result = tune(spec, stage2_top=0)
    e = next(e for e in result.ranked if e.candidate.disagg is not None)
    ms = recommendation_manifests(result, e, "chat", "serving")
    assert ("Deployment", "chat-router") in {(m["kind"], m["metadata"]["name"]) for m in ms}
    for m in ms:
        validate(m)
        if m["kind"] == "Deployment" and m["metadata"]["name"] != "chat-router":
            pod = m["spec"]["template"]["spec"]
            assert pod["runtimeClassName"] == "nvidia"  # spec.deploy reaches the manifests
            assert {"claimName": "models", "readOnly": False} in [v.get("persistentVolumeClaim")
                                                                  for v in pod["volumes"]]
    jobs = bench_jobs(result, "chat", "serving")
    assert len(jobs) == len(result.shortlist()) >= 2
    for i, job in enumerate(jobs, 1):
        validate(job)
        assert job["metadata"]["name"] == f"chat-bench-{i}"
        argv = _container(job)["args"]
        assert argv[argv.index("--random-input-len") + 1] == "2000"
        assert argv[argv.index("--random-output-len") + 1] == "200"
        assert argv[argv.index("--request-rate") + 1] == "4"
        assert argv[argv.index("--num-prompts") + 1] == "300"
        assert argv[argv.index("--base-url") + 1] == "http://chat.serving.svc:8000"
        label = result.shortlist()[i - 1].candidate.label()
        assert job["metadata"]["annotations"]["inferasim.io/configuration"] == label
    with pytest.raises(SpecError, match="runtimeClassName"):
        parse_spec({"model": MODEL, "hardware": {"gpu": "MI300X"}, "workload": {"static": {"requestRate": 1}},
                    "deploy": {"runtimeClassName": "nvidia"}})


def test_closed_loop_bench_caps_concurrency() -> None:
    cfg = ServingConfig(engine="sglang", model=MODEL, gpu="H200", layout=Layout(tp=1))
    argv = _container(render_bench_job(cfg, "s", "s-bench", BenchWorkload(100, 10, None, 50, max_concurrency=8)))[
        "args"]
    assert "--request-rate" not in argv and argv[argv.index("--max-concurrency") + 1] == "8"


def test_operator_canaries_of_rocm_pods_stay_restricted() -> None:
    """The renderer's container-level seccomp Unconfined for ROCm gives way to the operator's
    RuntimeDefault when it starts a canary (Pod Security "restricted" refuses Unconfined at any level)."""
    from inferasim_operator.pod_security import harden_pod, is_restricted

    pod = render_manifests(ServingConfig(engine="sglang", model=MODEL, gpu="MI300X", layout=Layout(tp=1)),
                           "c")[0]["spec"]["template"]["spec"]
    assert "sglang: seccompProfile is not RuntimeDefault" in is_restricted(copy.deepcopy(pod))
    hardened = harden_pod(pod)
    assert is_restricted(hardened) == []
    assert "seccompProfile" not in hardened["containers"][0]["securityContext"]
    assert hardened["securityContext"]["supplementalGroups"] == [44]  # the video group stays
