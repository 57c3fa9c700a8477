"""The few Kubernetes API calls the operator makes beside kopf's own (kubernetes client, sync:
callers run them with asyncio.to_thread). Objects go in and come out as plain dicts."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from inferasim.errors import InferasimError
from inferasim_operator.models import ANCHOR_PLURAL, GROUP, LABEL_MANAGED, MANAGER, TUNING_PLURAL, VERSION

__all__ = ["ApiException", "Kube", "NotManaged", "load_config", "managed"]

log = logging.getLogger("inferasim_operator")


class NotManaged(InferasimError):
    """An object the operator would patch or delete exists and does not carry its label
    (app.kubernetes.io/managed-by=inferasim-operator): it is left alone. Roles cannot say "only
    objects with this label", so the operator checks before it changes anything."""


def managed(obj: dict[str, Any] | None) -> bool:
    """Whether ``obj`` carries the operator's own label."""
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_MANAGED) == MANAGER


def _refuse(kind: str, namespace: str, name: str) -> NotManaged:
    where = f"{namespace}/{name}" if namespace else name
    return NotManaged(f"{kind} {where} exists and is not the operator's (no label {LABEL_MANAGED}={MANAGER}): "
                      "left alone; rename or delete it, or give the tuning another name")


def _preconditions(obj: dict[str, Any]) -> client.V1DeleteOptions:
    """Delete exactly the object that was checked (not one recreated under its name meanwhile)."""
    meta = obj.get("metadata") or {}
    return client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=meta.get("uid"),
                                                                       resource_version=meta.get("resourceVersion")))


def without_empty_strings(obj: Any, *, patch: bool) -> Any:
    """Custom-resource bodies without "" values: absent reads the same through the pydantic models
    (every string field defaults to ""), and the locally built v1.20 API server (Go 1.19 with the
    swapped json-iterator, scripts/k8s) decodes "" in custom resources as null and then refuses it.
    In a merge patch "" becomes null, which removes the field (reads as "")."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if v == "":
                if patch:
                    out[k] = None
                continue
            out[k] = without_empty_strings(v, patch=patch)
        return out
    if isinstance(obj, list):
        return [without_empty_strings(v, patch=False) for v in obj if v != ""]
    return obj


def merge_patch_to(old: Any, new: Any) -> Any:
    """A JSON merge patch (RFC 7386) turning ``old`` into ``new``: ``new`` plus null for every key
    of ``old`` it lacks, so a merge patch replaces rather than accumulates (no PUT needed, so no
    `update` verb in the ClusterRole)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        out[k] = merge_patch_to(old.get(k), v)
    return out


def own(obj: dict[str, Any], owner: Any) -> None:
    """Make the tuning `owner` the owner of `obj` (garbage-collected with it) in its namespace.

    Not kopf.adopt: that also copies the owner's labels onto the child, and a tuning synced by
    Argo CD carries its tracking label (app.kubernetes.io/instance): Argo CD would then count the
    operator's Jobs, ConfigMaps and canaries as part of the app, missing from Git, and prune them
    (actions-runner-controller fixed the same in PR #3540). The operator sets its own labels."""
    import kopf

    kopf.append_owner_reference(obj, owner=owner)
    kopf.harmonize_naming(obj, name=owner.get("metadata", {}).get("name"))
    kopf.adjust_namespace(obj, namespace=owner.get("metadata", {}).get("namespace"))


def sharing_owner(owner: dict[str, Any]) -> dict[str, Any]:
    """An ownerReference to the tuning `owner` that does not claim control: a second tuning waiting
    for a Job another started, so that the garbage collector deletes the Job only with its last owner."""
    meta = owner["metadata"]
    return {"apiVersion": owner.get("apiVersion", ""), "kind": owner.get("kind", ""), "name": meta["name"],
            "uid": meta["uid"], "controller": False, "blockOwnerDeletion": True}


def load_config() -> None:
    """In-cluster when running in a pod, else KUBECONFIG / ~/.kube/config."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    # Connections kept per host: the operator calls the API from up to 64 threads (handlers.py).
    cfg = client.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = 64
    client.Configuration.set_default(cfg)


class Kube:
    def __init__(self, api: client.ApiClient | None = None) -> None:
        self.api = api or client.ApiClient()
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.coordination = client.CoordinationV1Api(self.api)

    def _dict(self, obj: Any) -> dict[str, Any]:
        return obj if isinstance(obj, dict) else self.api.sanitize_for_serialization(obj)

    def _read(self, read: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
        """`read(*args)` as a dict; None when the object does not exist (404)."""
        try:
            return self._dict(read(*args))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    # -- ServingTuning -------------------------------------------------------------------------

    def get_tuning(self, namespace: str, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, TUNING_PLURAL, name)

    def patch_tuning_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        # A merge patch on the status subresource (lists are replaced whole, as conditions need).
        return self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, TUNING_PLURAL, name, {"status": without_empty_strings(status, patch=True)})

    # -- ServingAnchor -------------------------------------------------------------------------

    def list_anchors(self) -> list[dict[str, Any]]:
        return self.custom.list_cluster_custom_object(GROUP, VERSION, ANCHOR_PLURAL).get("items", [])

    def create_anchor(self, body: dict[str, Any]) -> bool:
        """True when created, False when an anchor of that name exists already."""
        try:
            self.custom.create_cluster_custom_object(GROUP, VERSION, ANCHOR_PLURAL,
                                                     without_empty_strings(body, patch=False))
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    def get_anchor(self, name: str) -> dict[str, Any] | None:
        return self._read(self.custom.get_cluster_custom_object, GROUP, VERSION, ANCHOR_PLURAL, name)

    def apply_anchor(self, body: dict[str, Any], old: dict[str, Any] | None = None) -> bool:
        """Create the ServingAnchor, or merge-patch its labels, annotations and spec to ``body``'s
        when it exists (a canary anchor is updated by each measurement; keys of the ``old`` spec
        that ``body`` lacks are removed). True when created."""
        if self.create_anchor(body):
            return True
        meta = body["metadata"]
        current = self.get_anchor(meta["name"])
        if current is not None and not managed(current):
            raise _refuse("ServingAnchor", "", meta["name"])
        old = old if old is not None else current
        patch = {"metadata": {"labels": meta.get("labels", {}), "annotations": meta.get("annotations", {})},
                 "spec": merge_patch_to(((old or {}).get("spec") or {}), body["spec"])}
        self.custom.patch_cluster_custom_object(GROUP, VERSION, ANCHOR_PLURAL, meta["name"],
                                                without_empty_strings(patch, patch=True))
        return False

    def patch_anchor_status(self, name: str, status: dict[str, Any]) -> None:
        if not managed(self.get_anchor(name)):
            raise _refuse("ServingAnchor", "", name)
        self.custom.patch_cluster_custom_object_status(GROUP, VERSION, ANCHOR_PLURAL, name,
                                                       {"status": without_empty_strings(status, patch=True)})

    # -- Jobs and pods -------------------------------------------------------------------------

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(self.batch.read_namespaced_job, name, namespace)

    def create_job(self, body: dict[str, Any]) -> bool:
        try:
            self.batch.create_namespaced_job(body["metadata"]["namespace"], body)
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    def set_job_owners(self, namespace: str, name: str, owners: list[dict[str, Any]]) -> None:
        """Replace a Job's ownerReferences (a merge patch replaces the list whole)."""
        if not managed(self.get_job(namespace, name)):
            raise _refuse("Job", namespace, name)
        self.batch.patch_namespaced_job(name, namespace, {"metadata": {"ownerReferences": owners}})

    def delete_job(self, namespace: str, name: str) -> bool:
        """Delete a Job and its pods (background propagation); False when there was none."""
        job = self.get_job(namespace, name)
        if job is None:
            return False
        if not managed(job):
            raise _refuse("Job", namespace, name)
        try:
            self.batch.delete_namespaced_job(name, namespace, propagation_policy="Background",
                                             body=_preconditions(job))
            return True
        except ApiException as exc:
            if exc.status != 404:
                raise
            return False

    # -- harvest locks (Leases in the operator's namespace, harvest_lock.py) ------------------------

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(self.coordination.read_namespaced_lease, name, namespace)

    def create_lease(self, body: dict[str, Any]) -> bool:
        """True when created, False when one of that name exists."""
        try:
            self.coordination.create_namespaced_lease(body["metadata"]["namespace"], body)
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    def replace_lease(self, body: dict[str, Any]) -> bool:
        """Replace a Lease at the resourceVersion in ``body``; False when it changed meanwhile (409)."""
        meta = body["metadata"]
        try:
            self.coordination.replace_namespaced_lease(meta["name"], meta["namespace"], body)
            return True
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise

    def delete_lease(self, namespace: str, name: str) -> None:
        try:
            self.coordination.delete_namespaced_lease(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return [self._dict(p) for p in self.core.list_namespaced_pod(namespace, label_selector=label_selector).items]

    # -- ConfigMaps and Deployments ------------------------------------------------------------

    def apply_config_map(self, body: dict[str, Any]) -> None:
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            self.core.create_namespaced_config_map(ns, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            if not managed(self.get_config_map(ns, name)):
                raise _refuse("ConfigMap", ns, name) from None
            self.core.patch_namespaced_config_map(name, ns, {"metadata": {"labels": body["metadata"].get("labels", {}),
                                                                          "annotations":
                                                                              body["metadata"].get("annotations", {})},
                                                             "data": body["data"]})

    def delete_config_map(self, namespace: str, name: str) -> bool:
        """Delete the operator's ConfigMap; False when there was none (or one that is not the operator's:
        left alone, with a warning)."""
        cm = self.get_config_map(namespace, name)
        if cm is None:
            return False
        if not managed(cm):
            log.warning("%s", _refuse("ConfigMap", namespace, name))
            return False
        try:
            self.core.delete_namespaced_config_map(name, namespace, body=_preconditions(cm))
            return True
        except ApiException as exc:
            if exc.status != 404:
                raise
            return False

    def delete_deployments(self, namespace: str, label_selector: str, keep: set[str] | frozenset[str] = frozenset()
                           ) -> list[str]:
        """Delete the Deployments matching `label_selector` whose names are not in `keep`; their names."""
        gone = []
        for d in self.apps.list_namespaced_deployment(namespace, label_selector=label_selector).items:
            if d.metadata.name in keep or not managed(self._dict(d)):
                continue
            try:
                self.apps.delete_namespaced_deployment(d.metadata.name, namespace, body=_preconditions(self._dict(d)))
                gone.append(d.metadata.name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return gone

    def delete_deployment(self, namespace: str, name: str) -> bool:
        """Delete one of the operator's Deployments (a canary); False when there was none."""
        dep = self.get_deployment(namespace, name)
        if dep is None:
            return False
        if not managed(dep):
            raise _refuse("Deployment", namespace, name)
        try:
            self.apps.delete_namespaced_deployment(name, namespace, body=_preconditions(dep))
            return True
        except ApiException as exc:
            if exc.status != 404:
                raise
            return False

    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(self.core.read_namespaced_config_map, name, namespace)

    def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(self.apps.read_namespaced_deployment, name, namespace)

    def apply_deployment(self, body: dict[str, Any]) -> None:
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            self.apps.create_namespaced_deployment(ns, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            if not managed(self.get_deployment(ns, name)):
                raise _refuse("Deployment", ns, name) from None
            self.apps.patch_namespaced_deployment(name, ns, {"metadata": {"labels": body["metadata"]["labels"]},
                                                             "spec": body["spec"]})

    def apply_custom(self, group: str, version: str, plural: str, body: dict[str, Any]) -> None:
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            self.custom.create_namespaced_custom_object(group, version, ns, plural, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            current = self._read(self.custom.get_namespaced_custom_object, group, version, ns, plural, name)
            if not managed(current):
                raise _refuse(plural, ns, name) from None
            self.custom.patch_namespaced_custom_object(group, version, ns, plural, name, {"spec": body["spec"]})

    def delete_custom(self, group: str, version: str, plural: str, namespace: str, name: str) -> bool:
        """Delete one of the operator's namespaced custom objects; False when there was none (or its CRD
        is not installed, or it is not the operator's: left alone, with a warning)."""
        current = self._read(self.custom.get_namespaced_custom_object, group, version, namespace, plural, name)
        if current is None:
            return False
        if not managed(current):
            log.warning("%s", _refuse(plural, namespace, name))
            return False
        try:
            self.custom.delete_namespaced_custom_object(group, version, namespace, plural, name,
                                                        body=_preconditions(current))
            return True
        except ApiException as exc:
            if exc.status != 404:
                raise
            return False
