"""Harvest Jobs: deterministic names, budget-derived limits, the pod, and the anchor's way back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from inferasim_operator.harvest_job import (
    DONE_FILE,
    MESSAGE_LIMIT,
    MESSAGE_PREFIX,
    HarvestTarget,
    MessageError,
    anchor_object,
    build_job,
    decode_anchor,
    encode_anchor,
    job_limits,
    terminated_message,
)

from inferasim.core.layout import Layout
from inferasim.core.spec import HarvestPolicy
from inferasim.model.anchor_store import AnchorStore
from inferasim.model.anchors import Anchor, StepPoint

REPO = Path(__file__).resolve().parents[2]
MISSING = {"engine": "vllm", "model": "meta-llama/Meta-Llama-3-8B", "gpu": "MI300X", "precision": "bf16",
           "harvest_layout": {"tp": 1, "pp": 1, "dp": 1, "moe_tp": 1, "moe_ep": 1}, "harvest_gpu_hours": 1 / 3}


def target(**over: object) -> HarvestTarget:
    return HarvestTarget.from_missing({**MISSING, **over})


def test_job_name_is_deterministic_and_per_kernel_set_and_layout() -> None:
    a, b = target(), target()
    assert a.job_name == b.job_name and a.key == b.key
    assert a.job_name.startswith("harvest-vllm-") and a.job_name.endswith("-tp1") and len(a.job_name) <= 63
    tp2 = target(harvest_layout={"tp": 2})
    fp8 = target(precision="fp8")
    assert len({a.job_name, tp2.job_name, fp8.job_name}) == 3


@pytest.mark.parametrize("budget,deadline_min,expect", [
    (4.0, 60, (3600, 2)),      # three tries fit; the deadline caps them all
    (0.5, 60, (1800, 0)),      # one try: the deadline is what the budget buys
    (1 / 3, 60, (1200, 0)),
])
def test_limits_from_the_gpu_hour_budget(budget: float, deadline_min: int, expect: tuple[int, int]) -> None:
    lim = job_limits(target(), HarvestPolicy(allowed=True, max_gpu_hours=budget, deadline_minutes=deadline_min),
                     remaining_gpu_hours=budget)
    assert lim is not None
    assert (lim.active_deadline_s, lim.backoff_limit) == expect
    assert lim.budget_gpu_hours <= budget + 1e-6


def test_no_job_when_the_budget_does_not_buy_one_try() -> None:
    policy = HarvestPolicy(allowed=True, max_gpu_hours=4.0)
    assert job_limits(target(), policy, remaining_gpu_hours=0.2) is None
    assert job_limits(target(), HarvestPolicy(allowed=True, max_gpu_hours=0.0), 10) is None
    eight = target(harvest_layout={"tp": 8}, harvest_gpu_hours=8 / 3)
    lim = job_limits(eight, policy, 4.0)
    assert lim is not None and lim.active_deadline_s == 1800 and lim.backoff_limit == 0  # 4 GPU-h / 8 GPUs


def test_the_engine_gets_the_start_up_tune_estimated() -> None:
    """A large model loads its weights for many minutes: the harvester waits for the engine that long
    and measures in what the try leaves; a small one keeps most of the try for measuring."""
    policy = HarvestPolicy(allowed=True, max_gpu_hours=8.0, deadline_minutes=60)
    big = target(harvest_layout={"tp": 8}, harvest_gpu_hours=8.0, harvest_startup_s=1500)
    lim = job_limits(big, policy, 8.0)
    assert lim is not None and lim.backoff_limit == 0
    assert lim.ready_timeout_s == 1500 and lim.harvest_budget_s == 3600 - 1500
    small = job_limits(target(harvest_gpu_hours=1 / 3, harvest_startup_s=320), policy, 8.0)
    assert small is not None and small.harvest_budget_s == 1200 - 320 and small.ready_timeout_s == 320  # 3 tries
    job = build_job(big, policy, lim, namespace="llm", tuning="chat", harvester_image="op:1")
    args = job["spec"]["template"]["spec"]["containers"][1]["args"]
    assert args[args.index("--ready-timeout-s") + 1] == "1500"
    assert target().startup_s == 600  # a report from before tune estimated it


def test_harvest_time_grows_with_the_weights_each_node_loads() -> None:
    from inferasim.catalog.models import get_model
    from inferasim.harvest.plan import ENGINE_INIT_S, MEASURE_S, engine_startup_s, harvest_gpu_hours

    small, big = get_model("meta-llama/Meta-Llama-3-8B"), get_model("meta-llama/Llama-3.1-70B")
    s8 = engine_startup_s(small, Layout(tp=1), "bf16", 8)
    s70 = engine_startup_s(big, Layout(tp=4), "bf16", 8)
    assert ENGINE_INIT_S < s8 < s70  # 16 GB against 140 GB read by the node
    assert engine_startup_s(big, Layout(tp=4), "fp8", 8) < s70  # half the bytes
    # two nodes read half the weights each, in parallel
    assert engine_startup_s(big, Layout(tp=16), "bf16", 8) < engine_startup_s(big, Layout(tp=8), "bf16", 8)
    assert harvest_gpu_hours(big, Layout(tp=4), "bf16", 8) == pytest.approx(4 * (s70 + MEASURE_S) / 3600)


def test_job_manifest() -> None:
    policy = HarvestPolicy(allowed=True, max_gpu_hours=2)
    t = target()
    lim = job_limits(t, policy, 2)
    assert lim is not None
    job = build_job(t, policy, lim, namespace="llm", tuning="chat", harvester_image="op:1",
                    extra_harvest_args=["--speedup", "20"])
    assert job["apiVersion"] == "batch/v1" and job["metadata"]["name"] == t.job_name
    assert job["metadata"]["labels"]["inferasim.io/anchor"] == t.key
    spec = job["spec"]
    assert spec["activeDeadlineSeconds"] == lim.active_deadline_s and spec["backoffLimit"] == lim.backoff_limit
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"][0]["values"] for t in terms] == [["AMD_Instinct_MI300X_OAM"], ["74a1", "74b5"]]
    assert pod["tolerations"] == [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    engine, harvester = pod["containers"]
    # The memory limit is the request (inferasim.render_pod): a GPU pod never grows into its neighbours' memory.
    assert engine["resources"]["limits"] == {"amd.com/gpu": "1", "memory": engine["resources"]["requests"]["memory"]}
    assert engine["image"].startswith("vllm/vllm-openai-rocm:")
    assert "vllm serve meta-llama/Meta-Llama-3-8B" in engine["command"][2] and DONE_FILE in engine["command"][2]
    assert "livenessProbe" not in engine
    assert harvester["image"] == "op:1" and harvester["command"] == ["python", "-m", "inferasim_operator.harvest_pod"]
    args = harvester["args"]
    run = args[args.index("--") + 1:]
    assert run[run.index("--engine") + 1] == "vllm" and run[run.index("--gpu") + 1] == "MI300X"
    assert run[-2:] == ["--speedup", "20"] and "--out" in run
    assert {"name": "harvest", "emptyDir": {}} in pod["volumes"]
    assert "ownerReferences" not in job["metadata"]  # kopf.adopt adds them in the operator
    # Restricted: seccomp, no token, nothing escalates, no capabilities; the harvester (the
    # operator's image) runs as its non-root user, the engine image as it was built.
    from inferasim_operator.pod_security import is_restricted

    assert is_restricted(pod) == []
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert harvester["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                            "runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001}
    assert "runAsNonRoot" not in engine["securityContext"]


def test_policy_overrides() -> None:
    policy = HarvestPolicy(allowed=True, images={"vllm": "my/vllm:1"}, node_selector={"pool": "gpu"},
                           tolerations=[{"key": "x", "operator": "Exists"}])
    t = target(gpu="H100", harvest_gpu_hours=0.3)
    lim = job_limits(t, policy, 4)
    assert lim is not None
    job = build_job(t, policy, lim, namespace="a", tuning="b", harvester_image="op:1")
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "my/vllm:1"
    res = pod["containers"][0]["resources"]
    assert res["limits"] == {"nvidia.com/gpu": "1", "memory": res["requests"]["memory"]}
    assert pod["nodeSelector"] == {"pool": "gpu"} and pod["tolerations"] == [{"key": "x", "operator": "Exists"}]


def some_anchor() -> Anchor:
    store = AnchorStore(REPO / "anchors")
    return max(store.all(), key=lambda a: len(a.points))


def test_anchor_round_trip_through_a_termination_message() -> None:
    a = some_anchor()
    msg = encode_anchor(a)
    assert msg.startswith(MESSAGE_PREFIX) and len(msg) <= MESSAGE_LIMIT
    b = decode_anchor(msg)
    assert b.id == a.id and b.points == a.points and b.params == a.params


def test_big_anchors_drop_steps_and_bad_messages_are_refused() -> None:
    a = some_anchor()
    assert a.points
    big = a.model_copy(update={"steps": [_step(i) for i in range(4000)]})
    msg = encode_anchor(big)
    assert len(msg) <= MESSAGE_LIMIT
    slim = decode_anchor(msg)
    assert slim.steps == [] and slim.points == a.points and "step points dropped" in slim.provenance.notes
    for bad in ("", "hello", MESSAGE_PREFIX + "!!!", MESSAGE_PREFIX + "aGVsbG8="):
        with pytest.raises(MessageError):
            decode_anchor(bad)


def _step(i: int) -> StepPoint:
    return StepPoint(n_decode=1 + i % 64, decode_context=float(i), n_prefill_tokens=i % 7, step_ms=1.0 + i / 1000)


def test_anchor_object_and_terminated_message() -> None:
    a = some_anchor()
    obj = anchor_object(a, harvested_by="llm/chat", job="llm/harvest-x")
    assert obj["kind"] == "ServingAnchor" and obj["metadata"]["name"] == a.id.lower()
    assert Anchor.model_validate(obj["spec"]).id == a.id
    pod = {"status": {"containerStatuses": [
        {"name": "vllm", "state": {"terminated": {"exitCode": 0}}},
        {"name": "harvester", "state": {"terminated": {"exitCode": 0, "message": "m"}}}]}}
    assert terminated_message(pod) == "m"
    assert terminated_message({"status": {"containerStatuses": [{"name": "harvester", "state": {"running": {}}}]}}) \
        is None


def test_harvest_pod_against_an_emulator(tmp_path: Path) -> None:
    """The harvester container's program, end to end against an emulated engine (no cluster)."""
    from inferasim.emulator import EmulatorConfig, start_emulator

    with start_emulator(EmulatorConfig(model="meta-llama/Meta-Llama-3-8B", gpu="MI300X", engine="vllm",
                                       speedup=20, precision="bf16")) as h:
        r = subprocess.run([sys.executable, "-m", "inferasim_operator.harvest_pod", "--endpoint", h.url,
                            "--done-file", str(tmp_path / "done"), "--anchor-file", str(tmp_path / "a.json"),
                            "--termination-log", str(tmp_path / "term"), "--ready-timeout-s", "30", "--",
                            "--endpoint", h.url, "--engine", "vllm", "--model", "meta-llama/Meta-Llama-3-8B",
                            "--gpu", "MI300X", "--precision", "bf16", "--tp", "1", "--out", str(tmp_path / "a.json"),
                            "--speedup", "20", "--plan", "512x128@1,4,16;2048x64@4", "--max-rms-log-error", "1.5",
                            "--quiet"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "done").exists()
    anchor = decode_anchor((tmp_path / "term").read_text())
    assert anchor.kernel_set.engine == "vllm" and anchor.provenance.method == "harvest"


def test_harvest_pod_gives_up_on_an_engine_that_never_starts(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "inferasim_operator.harvest_pod", "--endpoint",
                        f"http://127.0.0.1:{port}", "--done-file", str(tmp_path / "done"), "--anchor-file",
                        str(tmp_path / "a.json"), "--termination-log", str(tmp_path / "term"),
                        "--ready-timeout-s", "1", "--", "--endpoint", "x"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert (tmp_path / "done").exists()  # the engine container is told to stop either way
    assert "was not ready" in (tmp_path / "term").read_text()


def test_layout_labels_used_in_names() -> None:
    assert Layout(tp=4, moe_ep=4).label() == "tp4-ep4"
    assert target(harvest_layout={"tp": 4, "moe_ep": 4}).job_name.endswith("-tp4-ep4")


def test_engine_image_precedence_spec_then_operator_then_catalog() -> None:
    from inferasim_operator.settings import parse_engine_images

    from inferasim.catalog.engines import default_image

    images = parse_engine_images("amd/vllm=reg/vllm-rocm:9, nvidia/sglang=reg/sglang:9,amd/sglang=")
    assert images == {("amd", "vllm"): "reg/vllm-rocm:9", ("nvidia", "sglang"): "reg/sglang:9"}
    for bad in ("vllm=x", "intel/vllm=x", "amd/trtllm=x", "amd/vllm"):
        with pytest.raises(ValueError, match="INFERASIM_ENGINE_IMAGES"):
            parse_engine_images(bad)

    def image(policy: HarvestPolicy, **over: object) -> str:
        t = target(**over)
        lim = job_limits(t, policy, 4)
        assert lim is not None
        job = build_job(t, policy, lim, namespace="a", tuning="b", harvester_image="op:1", engine_images=images)
        return job["spec"]["template"]["spec"]["containers"][0]["image"]

    plain = HarvestPolicy(allowed=True, max_gpu_hours=4)
    assert image(plain) == "reg/vllm-rocm:9"  # MI300X: the operator's AMD vLLM image
    assert image(HarvestPolicy(allowed=True, max_gpu_hours=4, images={"vllm": "mine:1"})) == "mine:1"
    # No operator image for SGLang on AMD: the catalog's per-GPU choice.
    assert image(plain, engine="sglang") == default_image("sglang", "amd", "MI300X")


def test_chart_engine_images_are_the_catalogs() -> None:
    """The chart's defaults (values.yaml engineImages) are the catalog's images, so that installing
    the chart changes nothing until a user sets them."""
    import yaml

    from inferasim.catalog.engines import default_image

    values = yaml.safe_load((REPO / "charts" / "inferasim-operator" / "values.yaml").read_text())
    for vendor, engines in values["engineImages"].items():
        for engine, img in engines.items():
            if img:
                assert img == default_image(engine, vendor, "MI300X" if vendor == "amd" else "H100"), (vendor, engine)
    assert set(values["engineImages"]["amd"]) == {"vllm", "sglang", "atom"}
