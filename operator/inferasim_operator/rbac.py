"""The operator's least-privilege RBAC rules: one source for the Helm chart (generated into
charts/inferasim-operator/files/*-rules.yaml by `make crds`) and the e2e tests.

Three sets, bound three ways by the chart:

- CLUSTER_RULES, a ClusterRole: only what is cluster-wide by nature. Reading CRDs and namespaces
  (kopf's discovery) and the cluster-scoped ServingAnchors (read by every search, written by
  harvests, canaries and passive fits). Nothing namespaced is written through it.
- NAMESPACE_RULES, a Role and RoleBinding in each watched namespace: the tunings there, their
  Events, harvest Jobs (and their pods, read), the recommendation's ConfigMap, canary Deployments,
  Argo Rollouts AnalysisTemplates. Outside the watched namespaces (kube-system included) the
  operator's account can write nothing.
- OPERATOR_NAMESPACE_RULES, a Role in the operator's own namespace: the harvest locks (Leases: one
  harvest Job per anchor across the cluster, harvest_lock.py) and the GPU prices ConfigMap (read).

No Secrets anywhere: the operator never reads them (pods it renders reference an optional HF token
Secret by name, which needs no permission). The operator changes only objects that carry its own
label (kube.py checks before each patch and delete), since a Role cannot say so.
"""

from __future__ import annotations

from typing import Any

from inferasim_operator.models import ANCHOR_PLURAL, GROUP, TUNING_PLURAL

READ = ["get", "list", "watch"]

CLUSTER_RULES: list[dict[str, Any]] = [
    # kopf: discovering the CRDs and the namespaces it serves.
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": READ},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": READ},
    # ServingAnchors are cluster-scoped: read by every search, written by harvests, canaries and
    # passive fits (patched only when they carry the operator's label).
    {"apiGroups": [GROUP], "resources": [ANCHOR_PLURAL], "verbs": [*READ, "create", "patch"]},
    {"apiGroups": [GROUP], "resources": [f"{ANCHOR_PLURAL}/status"], "verbs": ["get", "patch"]},
]

NAMESPACE_RULES: list[dict[str, Any]] = [
    # The custom resources: watch tunings, write their status (and kopf's annotations on them).
    {"apiGroups": [GROUP], "resources": [TUNING_PLURAL], "verbs": [*READ, "patch"]},
    {"apiGroups": [GROUP], "resources": [f"{TUNING_PLURAL}/status"], "verbs": ["get", "patch"]},
    # Owner references with blockOwnerDeletion (every owned Job, ConfigMap and canary): the
    # OwnerReferencesPermissionEnforcement admission plugin (on by default on OpenShift) asks for
    # update on the owner's finalizers subresource.
    {"apiGroups": [GROUP], "resources": [f"{TUNING_PLURAL}/finalizers"], "verbs": ["update"]},
    # Events for every step.
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    # Harvest Jobs, and their pods' termination messages (the harvested anchor).
    # Patched to add a second owner (a tuning waiting for another's Job); deleted only when the last
    # tuning that owns one switches harvesting off while it runs.
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": [*READ, "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": READ},
    # The recommendation's ConfigMap (GitOps). Deleted when a pass ends without a recommendation
    # (it must not keep serving the last one).
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": [*READ, "create", "patch", "delete"]},
    # The target (read) and the canary Deployments (owned, removed after measuring).
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": [*READ, "create", "patch", "delete"]},
    # Argo Rollouts confirmation; the template is withdrawn with the recommendation it checks.
    {"apiGroups": ["argoproj.io"], "resources": ["analysistemplates"], "verbs": ["get", "create", "patch", "delete"]},
]

OPERATOR_NAMESPACE_RULES: list[dict[str, Any]] = [
    # Harvest locks: one Lease per anchor, created by the tuning that starts its Job (harvest_lock.py).
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update", "delete"]},
    # The GPU prices ConfigMap (pricing.py).
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
]

# The rule files of the chart, by file name.
RULE_FILES = {"clusterrole-rules.yaml": CLUSTER_RULES, "namespace-rules.yaml": NAMESPACE_RULES,
              "operator-namespace-rules.yaml": OPERATOR_NAMESPACE_RULES}

# Before the split, one ClusterRole held every rule; tests and scripts that bind it by that name.
RULES = CLUSTER_RULES


def _labels() -> dict[str, str]:
    return {"app.kubernetes.io/name": "inferasim-operator"}


def cluster_role(name: str = "inferasim-operator") -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": _labels()}, "rules": CLUSTER_RULES}


def role(name: str, namespace: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": name, "namespace": namespace, "labels": _labels()}, "rules": rules}


def role_binding(name: str, namespace: str, sa_namespace: str, sa: str, *,
                 cluster_role_name: str = "") -> dict[str, Any]:
    """A RoleBinding in ``namespace`` of the Role ``name`` (or of a ClusterRole) to the ServiceAccount."""
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole" if cluster_role_name else "Role",
           "name": cluster_role_name or name}
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace, "labels": _labels()}, "roleRef": ref,
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_namespace}]}
