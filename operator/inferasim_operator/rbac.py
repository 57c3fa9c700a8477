"""The operator's least-privilege ClusterRole rules: one source for the Helm chart (generated into
charts/inferasim-operator/files/clusterrole-rules.yaml by `make crds`) and the e2e tests.

No Secrets: the operator never reads them (pods it renders reference an optional HF token Secret
by name, which needs no permission).
"""

from __future__ import annotations

from typing import Any

from inferasim_operator.models import ANCHOR_PLURAL, GROUP, TUNING_PLURAL

RULES: list[dict[str, Any]] = [
    # The custom resources: watch tunings, write their status; read and write anchors.
    {"apiGroups": [GROUP], "resources": [TUNING_PLURAL], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [GROUP], "resources": [f"{TUNING_PLURAL}/status"], "verbs": ["get", "patch"]},
    # Owner references with blockOwnerDeletion (every owned Job, ConfigMap and canary): the
    # OwnerReferencesPermissionEnforcement admission plugin (on by default on OpenShift) asks for
    # update on the owner's finalizers subresource.
    {"apiGroups": [GROUP], "resources": [f"{TUNING_PLURAL}/finalizers"], "verbs": ["update"]},
    {"apiGroups": [GROUP], "resources": [ANCHOR_PLURAL], "verbs": ["get", "list", "watch", "create", "patch"]},
    {"apiGroups": [GROUP], "resources": [f"{ANCHOR_PLURAL}/status"], "verbs": ["get", "patch"]},
    # kopf: discovering the CRDs and the namespaces it serves.
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
    # Events for every step.
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    # Harvest Jobs, and their pods' termination messages (the harvested anchor).
    # Patched to add a second owner (a tuning waiting for another's Job); deleted only when the last
    # tuning that owns one switches harvesting off while it runs.
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    # The recommendation's ConfigMap (GitOps); `get` also reads the GPU prices ConfigMap.
    # Deleted when a pass ends without a recommendation (it must not keep serving the last one).
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    # The target (read) and the canary Deployments (owned, removed after measuring).
    {"apiGroups": ["apps"], "resources": ["deployments"],
     "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    # Argo Rollouts confirmation; the template is withdrawn with the recommendation it checks.
    {"apiGroups": ["argoproj.io"], "resources": ["analysistemplates"], "verbs": ["get", "create", "patch", "delete"]},
]


def cluster_role(name: str = "inferasim-operator") -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "inferasim-operator"}},
            "rules": RULES}
