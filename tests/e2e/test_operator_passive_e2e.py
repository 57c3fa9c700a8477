"""Passive anchors and PredictionDrift end to end: real control plane, real Prometheus, the operator
as a process under the chart's RBAC, an emulated vLLM (its own process) playing the live target.

The target Deployment `chat` runs (as far as the operator can tell) vLLM tp1 on one MI300X; an
emulator with known step-time parameters serves its traffic, which changes load over time (1, 4
and 12 clients in turn, each phase with its own prompt length, lengths drawn +-25% per request).
The ServingTuning observes it through Prometheus:

1. a passive ServingAnchor is fitted from the emulator's series and the tuning is Recommended with
   it, without any harvest Job (harvest is allowed: without the passive anchor there would be one);
2. the emulator's fixed step cost is multiplied by 4 mid-test (`/_inferasim/params`);
3. the operator's drift check raises PredictionDrift=True, refits the passive anchor from windows
   after the detection, re-tunes, and clears the condition (False, WithinThreshold).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from inferasim_e2e_support import (
    GROUP,
    PLURAL,
    VERSION,
    OperatorEnv,
    PhasedLoad,
    Prometheus,
    operator_in_namespace,
    wait_until,
)

from inferasim.model.steptime import StepParams

pytestmark = pytest.mark.e2e

MODEL, GPU = "meta-llama/Llama-3.1-8B", "MI300X"
SPEEDUP = 5.0
TRUTH = StepParams(t_fixed=6e-3, t_seq=3e-5, e_bw=0.65, e_kv=0.45, e_flops=0.45, e_attn=0.3, t_ttft=0.03)
# (clients, seconds, prompt tokens), cycled: the load a passive fit needs to tell the parameters apart.
PHASES = [(1, 8.0, 256), (4, 8.0, 2048), (12, 8.0, 768)]
STEP_S = 4
THRESHOLD = 0.5  # t_fixed x4 more than doubles the inter-token latency; windows of mixed phases stay well under


class Env(OperatorEnv):
    def passive_anchors(self) -> list[dict[str, Any]]:
        return [a for a in self.custom.list_cluster_custom_object(GROUP, VERSION, "servinganchors")["items"]
                if (a["metadata"].get("labels") or {}).get("inferasim.io/kind") == "passive"
                and (a["metadata"].get("annotations") or {}).get("inferasim.io/measured-by") == f"{self.ns}/chat"]


@pytest.fixture(scope="module")
def penv(cluster: Any, operator_kubeconfig: Path, gpu_node: str) -> Iterator[Env]:
    # No shipped anchors: without the passive anchor the live kernel set would be harvested.
    # Short windows for a test: a passive fit over the last 40 s in 4 s steps, the prediction
    # error over the last 6 s; the emulator runs 5 engine seconds per wall second.
    settings = {"INFERASIM_DRIFT_CHECK_SECONDS": "3", "INFERASIM_PASSIVE_WINDOW_S": "40",
                "INFERASIM_PASSIVE_STEP_S": str(STEP_S), "INFERASIM_PREDICTION_WINDOW_S": "6",
                "INFERASIM_ENGINE_SPEEDUP": f"{SPEEDUP:g}"}
    with operator_in_namespace(cluster.api, operator_kubeconfig, "e2e-passive", settings, log_lines=60) as base:
        e = Env(base.ns, base.api, base.op, base.tmp)
        try:
            yield e
        finally:
            for a in e.passive_anchors():
                e.custom.delete_cluster_custom_object(GROUP, VERSION, "servinganchors", a["metadata"]["name"])


@pytest.fixture(scope="module")
def emulated(penv: Env, prometheus: Prometheus) -> Iterator[dict[str, Any]]:
    """The live deployment's engine: an emulator process under phased load, scraped by Prometheus."""
    from inferasim.emulator import EmulatorConfig, spawn_emulator

    with spawn_emulator(EmulatorConfig(model=MODEL, gpu=GPU, engine="vllm", tp=1, speedup=SPEEDUP, params=TRUTH,
                                       precision="bf16")) as emu:
        prometheus.set_targets([{"targets": [emu.url.removeprefix("http://")],
                                 "labels": {"namespace": penv.ns, "deployment": "chat"}}])
        load = PhasedLoad(emu.url, emu.served_model_name, PHASES).start()
        try:
            yield {"emulator": emu, "load": load, "started": time.monotonic()}
        finally:
            load.stop()


def target_deployment(ns: str) -> dict[str, Any]:
    """What the live `chat` runs, as its manifest says (inferasim's renderer: vLLM, tp1, one MI300X)."""
    from inferasim.core.config import ServingConfig
    from inferasim.core.layout import Layout
    from inferasim.render import render_manifests

    cfg = ServingConfig(engine="vllm", model=MODEL, gpu=GPU, layout=Layout(tp=1), precision="bf16")
    return render_manifests(cfg, "chat", ns)[0]


def itl_at(anchor_obj: dict[str, Any], isl: int = 768, osl: int = 48, conc: int = 4) -> float:
    from inferasim.core.layout import Layout
    from inferasim.model.anchors import Anchor
    from inferasim.model.predictor import fitted_from_anchor

    return fitted_from_anchor(Anchor.model_validate(anchor_obj["spec"])).predict_layout(
        Layout(tp=1), isl, osl, conc)["tpot"] * 1e3


def test_passive_anchor_recommendation_and_prediction_drift(penv: Env, prometheus: Prometheus,
                                                            emulated: dict[str, Any]) -> None:
    from kubernetes import client

    apps, batch, core = client.AppsV1Api(penv.api), client.BatchV1Api(penv.api), client.CoreV1Api(penv.api)
    apps.create_namespaced_deployment(penv.ns, target_deployment(penv.ns))
    emu, load = emulated["emulator"], emulated["load"]
    # One full cycle of phases (and the scrapes after it) before the tuning exists: the live
    # deployment served users before anyone tuned it.
    cycle = sum(s for _, s, _ in PHASES)
    time.sleep(max(0.0, cycle + 3 - (time.monotonic() - emulated["started"])))
    spec = {
        "target": {"name": "chat"}, "model": MODEL, "precision": ["bf16"], "engines": ["vllm"],
        "hardware": {"gpu": "AMD_Instinct_MI300X", "gpusPerNode": 8, "maxGPUs": 8},
        "workload": {"prometheus": {"url": prometheus.url, "selector": {"namespace": penv.ns, "deployment": "chat"},
                                    "window": "20s"}},
        "harvest": {"allowed": True, "maxGPUHours": 2, "deadlineMinutes": 30},
        # The load changes on purpose: workload drift must not re-tune; prediction error must.
        "retune": {"driftThreshold": 100, "predictionErrorThreshold": THRESHOLD},
    }
    t0 = time.monotonic()
    penv.custom.create_namespaced_custom_object(GROUP, VERSION, penv.ns, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ServingTuning",
        "metadata": {"name": "chat", "namespace": penv.ns}, "spec": spec})

    # 1. passive ServingAnchor from the emulator's traffic, Recommended with it, no harvest Job
    st = wait_until(lambda: penv.status("chat") if penv.status("chat").get("phase") in
                    ("Recommended", "Harvesting", "Failed") else None, 150, "the tuning's first result")
    t_recommended = time.monotonic() - t0
    assert st["phase"] == "Recommended", (st.get("message"), st.get("passiveAnchor"))
    assert not batch.list_namespaced_job(penv.ns).items, "a harvest Job was created for the live kernel set"
    (obj,) = penv.passive_anchors()
    anchor = obj["spec"]
    assert anchor["provenance"]["method"] == "passive" and anchor["kernel_set"]["engine"] == "vllm"
    assert anchor["kernel_set"]["precision"] == "bf16" and anchor["layout"]["tp"] == 1
    assert "vllm:inter_token_latency_seconds_sum" in anchor["provenance"]["notes"]
    assert obj["metadata"]["annotations"]["inferasim.io/deployment"] == f"{penv.ns}/chat"
    fit_rms = anchor["fit"]["rms_log_error"]
    assert fit_rms < 0.25 and len(anchor["points"]) >= 3
    pa = st["passiveAnchor"]
    assert pa["state"] == "Fitted" and pa["anchor"] == obj["metadata"]["name"]
    used = st["anchors"]["used"]
    assert [u["provenance"] for u in used] == ["passive"], used
    assert penv.condition("chat", "AnchorsReady")["status"] == "True"
    assert "passive" in penv.condition("chat", "AnchorsReady")["message"]
    assert (st.get("recommendation") or {}).get("anchor") == used[0]["id"]
    events = {e.reason for e in core.list_namespaced_event(penv.ns, field_selector="involvedObject.name=chat").items}
    assert "PassiveAnchor" in events and "HarvestStarted" not in events, events
    itl_before = itl_at(obj)

    # 2. the prediction error of the running configuration is tracked and within the threshold
    def checked_within() -> dict[str, Any] | None:
        s = penv.status("chat")
        c = next((c for c in s.get("conditions") or [] if c["type"] == "PredictionDrift"), None)
        return s if c and c["status"] == "False" and (s.get("predictionError") or {}).get("worst") is not None \
            else None

    st = wait_until(checked_within, 60, "PredictionDrift=False with a prediction error")
    before = st["predictionError"]
    assert before["provenance"] == "passive" and before["threshold"] == THRESHOLD
    assert before["worst"] <= THRESHOLD and before["observed"]["itlMs"] > 0 and before["predicted"]["itlMs"] > 0
    metrics_text = httpx.get(f"http://127.0.0.1:{penv.op.metrics_port}/metrics", timeout=5).text
    assert f'inferasim_prediction_error{{metric="itl",namespace="{penv.ns}",tuning="chat"}}' in metrics_text

    # 3. the engine gets slower: PredictionDrift raised
    emu.set_params(StepParams(**{**TRUTH.as_dict(), "t_fixed": 4 * TRUTH.t_fixed}))
    t_change, wall_change = time.monotonic(), time.time()
    cond = wait_until(lambda: (c := penv.condition("chat", "PredictionDrift")) and c["status"] == "True" and c,
                      60, "PredictionDrift=True")
    t_raised = time.monotonic() - t_change
    assert cond["reason"] == "PredictionError" and "ITL" in cond["message"], cond
    drifted = penv.status("chat")["predictionError"]

    # 4. the passive anchor is refitted from windows after the change, and the condition clears
    def cleared() -> dict[str, Any] | None:
        c = penv.condition("chat", "PredictionDrift")
        return penv.status("chat") if c and c["status"] == "False" else None

    st = wait_until(cleared, 120, "PredictionDrift=False after the refit")
    t_cleared = time.monotonic() - t_change
    cond = penv.condition("chat", "PredictionDrift")
    assert cond["reason"] == "WithinThreshold"
    (obj,) = penv.passive_anchors()
    # post-change windows only (the anchor's window is an ISO 8601 interval)
    window_start = dt.datetime.fromisoformat(obj["spec"]["provenance"]["measured_at"].split("/")[0].replace("Z",
                                                                                                          "+00:00"))
    assert window_start.timestamp() >= wall_change, (window_start, wall_change)
    itl_after = itl_at(obj)
    assert itl_after > 1.5 * itl_before, (itl_before, itl_after)
    after = st["predictionError"]
    assert after["worst"] <= THRESHOLD and after["provenance"] == "passive"
    events = {e.reason for e in core.list_namespaced_event(penv.ns, field_selector="involvedObject.name=chat").items}
    assert {"PredictionDrift", "PredictionWithinThreshold"} <= events, events
    assert st["phase"] == "Recommended" and not batch.list_namespaced_job(penv.ns).items
    assert load.errors <= max(5, load.sent // 100), (load.sent, load.errors)
    print(f"\npassive e2e: Recommended {t_recommended:.1f} s after apply with the passive anchor "
          f"({len(anchor['points'])} windows, fit rms {fit_rms:.3f}, no harvest Job); prediction error before "
          f"{before['worst']:.1%}, after t_fixed x4 {drifted['worst']:.1%} (ITL {drifted['relative']['itlMs']:+.0%}); "
          f"PredictionDrift raised {t_raised:.1f} s after the change, cleared {t_cleared:.1f} s after it "
          f"(refit: {len(obj['spec']['points'])} windows, fit rms {obj['spec']['fit']['rms_log_error']:.3f}, "
          f"ITL at 4 in flight {itl_before:.2f} -> {itl_after:.2f} ms); error after {after['worst']:.1%}; "
          f"{load.sent} requests")
