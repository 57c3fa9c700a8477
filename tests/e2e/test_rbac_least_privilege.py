"""Least privilege, proved on the real API server: the chart rendered with two watched namespaces
and created for real, then the RBAC authorizer asked (SubjectAccessReview, and `kubectl auth can-i`
impersonating the chart's ServiceAccount) what that account may do.

Nothing outside the watched namespaces can be written (kube-system, default, another namespace;
in the operator's own namespace only its harvest Leases), Secrets cannot be read anywhere, and
cluster-wide the account writes only the cluster-scoped ServingAnchors.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from test_helm_chart import render

pytestmark = pytest.mark.e2e

WRITES = ("create", "update", "patch", "delete", "deletecollection")
# (resource, group) of what a compromised operator would want to write.
TARGETS = [("jobs", "batch"), ("cronjobs", "batch"), ("deployments", "apps"), ("daemonsets", "apps"),
           ("statefulsets", "apps"), ("pods", ""), ("pods/exec", ""), ("configmaps", ""), ("secrets", ""),
           ("serviceaccounts", ""), ("serviceaccounts/token", ""), ("services", ""),
           ("roles", "rbac.authorization.k8s.io"), ("rolebindings", "rbac.authorization.k8s.io"),
           ("servingtunings", "inferasim.io"),
           ("leases", "coordination.k8s.io"), ("events", "")]
CLUSTER_TARGETS = [("namespaces", ""), ("nodes", ""), ("clusterroles", "rbac.authorization.k8s.io"),
                   ("clusterrolebindings", "rbac.authorization.k8s.io"),
                   ("customresourcedefinitions", "apiextensions.k8s.io"),
                   ("validatingwebhookconfigurations", "admissionregistration.k8s.io"),
                   ("persistentvolumes", "")]


@pytest.fixture()
def chart(cluster: Any) -> Iterator[dict[str, Any]]:
    """The chart with watchNamespaces [a, b], released in its own namespace, created for real."""
    from kubernetes import client, utils

    s = uuid.uuid4().hex[:6]
    names = {"op": f"rbac-op-{s}", "a": f"rbac-a-{s}", "b": f"rbac-b-{s}", "other": f"rbac-x-{s}"}
    core = client.CoreV1Api(cluster.api)
    for ns in names.values():
        core.create_namespace({"metadata": {"name": ns}})
    docs = render({"watchNamespaces": [names["a"], names["b"]]}, namespace=names["op"])
    for d in docs:  # cluster-scoped names are unique to the test
        if d["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            d["metadata"]["name"] += f"-{s}"
        if d["kind"] == "ClusterRoleBinding":
            d["roleRef"]["name"] += f"-{s}"
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    try:
        for d in docs:
            utils.create_from_dict(cluster.api, d, namespace=d["metadata"].get("namespace") or names["op"])
        dep = next(d for d in docs if d["kind"] == "Deployment")
        sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
        yield {**names, "sa": sa, "user": f"system:serviceaccount:{names['op']}:{sa}", "api": cluster.api,
               "kubeconfig": cluster.kubeconfig, "docs": docs}
    finally:
        for d in docs:
            try:
                if d["kind"] == "ClusterRole":
                    rbac.delete_cluster_role(d["metadata"]["name"])
                elif d["kind"] == "ClusterRoleBinding":
                    rbac.delete_cluster_role_binding(d["metadata"]["name"])
            except client.ApiException:
                pass
        for ns in names.values():
            core.delete_namespace(ns)


def _allowed(c: dict[str, Any], verb: str, resource: str, group: str, namespace: str) -> bool:
    from kubernetes import client

    sub = ""
    if "/" in resource:
        resource, sub = resource.split("/", 1)
    review = client.AuthorizationV1Api(c["api"]).create_subject_access_review({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": c["user"], "groups": ["system:serviceaccounts", f"system:serviceaccounts:{c['op']}",
                                               "system:authenticated"],
                 "resourceAttributes": {"verb": verb, "resource": resource, "subresource": sub, "group": group,
                                        "namespace": namespace}}})
    return bool(review.status.allowed)


def _can_i_list(c: dict[str, Any], namespace: str) -> dict[str, set[str]]:
    """`kubectl auth can-i --list` as the chart's account: resource -> verbs."""
    r = subprocess.run(["kubectl", "auth", "can-i", "--list", "-n", namespace, f"--as={c['user']}",
                        "--as-group=system:serviceaccounts", f"--as-group=system:serviceaccounts:{c['op']}"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "KUBECONFIG": str(c["kubeconfig"])})
    assert r.returncode == 0, r.stderr
    out: dict[str, set[str]] = {}
    for line in r.stdout.splitlines()[1:]:
        m = re.match(r"^(\S+)\s+\[(.*?)\]\s+\[(.*?)\]\s+\[(.*?)\]\s*$", line)
        if m and m.group(1) != "":
            out.setdefault(m.group(1), set()).update(m.group(4).split())
    return out


def _can_i(c: dict[str, Any], verb: str, resource: str, namespace: str) -> bool:
    r = subprocess.run(["kubectl", "auth", "can-i", verb, resource, "-n", namespace, f"--as={c['user']}",
                        "--as-group=system:serviceaccounts", f"--as-group=system:serviceaccounts:{c['op']}"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "KUBECONFIG": str(c["kubeconfig"])})
    assert r.stdout.strip() in ("yes", "no"), r.stdout + r.stderr
    return r.stdout.strip() == "yes"


def test_nothing_outside_the_watched_namespaces_can_be_written_and_no_secret_read(chart: dict[str, Any]) -> None:
    c = chart
    # What the operator does, in the namespaces it watches ...
    for ns in (c["a"], c["b"]):
        for verb, res, group in (("create", "jobs", "batch"), ("delete", "jobs", "batch"),
                                 ("create", "deployments", "apps"), ("create", "configmaps", ""),
                                 ("patch", "servingtunings/status", "inferasim.io"), ("create", "events", ""),
                                 ("watch", "servingtunings", "inferasim.io"), ("list", "pods", "")):
            assert _allowed(c, verb, res, group, ns), (verb, res, ns)
    # ... and in its own namespace only the harvest locks (and reading the prices ConfigMap).
    assert _allowed(c, "create", "leases", "coordination.k8s.io", c["op"])
    assert _allowed(c, "get", "configmaps", "", c["op"])
    denied = []
    for ns in ("kube-system", "default", c["other"], c["op"]):
        for res, group in TARGETS:
            if ns == c["op"] and res == "leases":
                continue
            denied += [(v, res, ns) for v in WRITES if _allowed(c, v, res, group, ns)]
    assert denied == [], f"writable outside the watched namespaces: {denied}"
    # Secrets: never read, in any namespace (the watched ones included) or cluster-wide.
    for ns in ("kube-system", "default", c["a"], c["b"], c["op"], c["other"], ""):
        for verb in ("get", "list", "watch"):
            assert not _allowed(c, verb, "secrets", "", ns), (verb, ns)
    # Cluster-wide: only the cluster-scoped ServingAnchors are written (no namespaces, nodes, RBAC, CRDs ...).
    assert _allowed(c, "create", "servinganchors", "inferasim.io", "")
    assert [(v, r) for r, g in CLUSTER_TARGETS for v in WRITES if _allowed(c, v, r, g, "")] == []
    # A write through a watched namespace's objects into kube-system is impossible too: the
    # account cannot create pods or Deployments there, nor escalate by binding a role.
    for verb in ("bind", "escalate", "impersonate"):
        assert not _allowed(c, verb, "clusterroles", "rbac.authorization.k8s.io", "")
        assert not _allowed(c, verb, "roles", "rbac.authorization.k8s.io", c["a"])


def test_kubectl_auth_can_i_agrees(chart: dict[str, Any]) -> None:
    """The same through `kubectl auth can-i` (impersonation): the whole list of what the account may
    do in kube-system holds no write beyond the cluster-scoped ServingAnchors and the reviews every
    authenticated user may create, and nothing on Secrets."""
    c = chart
    assert _can_i(c, "create", "jobs.batch", c["a"]) and _can_i(c, "create", "deployments.apps", c["b"])
    for ns in ("kube-system", c["other"]):
        assert not _can_i(c, "create", "deployments.apps", ns)
        assert not _can_i(c, "get", "secrets", ns)
    assert not _can_i(c, "list", "secrets", c["a"])
    rules = _can_i_list(c, "kube-system")
    assert rules, "kubectl auth can-i --list printed nothing"
    reviews = {"selfsubjectaccessreviews.authorization.k8s.io", "selfsubjectrulesreviews.authorization.k8s.io"}
    writes = {r: v & set(WRITES) for r, v in rules.items() if v & set(WRITES) and r not in reviews}
    assert set(writes) <= {"servinganchors.inferasim.io", "servinganchors.inferasim.io/status"}, writes
    assert not [r for r in rules if r.startswith("secrets")], rules
    in_a = _can_i_list(c, c["a"])
    assert {"create", "delete"} <= in_a["jobs.batch"] and "create" in in_a["deployments.apps"]
