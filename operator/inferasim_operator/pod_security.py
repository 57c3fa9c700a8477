"""The securityContext of the pods the operator starts (harvest Jobs, canaries): the Pod Security
Standard "restricted" profile wherever the image allows it, and no ServiceAccount token.

- every container: allowPrivilegeEscalation false, all capabilities dropped, no privileged mode;
- the pod: seccomp RuntimeDefault, automountServiceAccountToken false (the pods talk to nothing
  but their own engine; a token would let whoever controls an engine image act as the namespace's
  default account);
- runAsNonRoot (with a fixed uid) for the containers whose image runs as a non-root user: the
  harvester (this operator's image, uid 10001). Engine images (vLLM, SGLang, ATOM) run as root,
  and a runAsNonRoot they cannot honour would keep them from starting.
"""

from __future__ import annotations

from typing import Any

# The operator's image (operator/Dockerfile) runs as this user.
OPERATOR_UID = 10001


def harden_pod(pod_spec: dict[str, Any], non_root: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """Restrict ``pod_spec`` in place (and return it); containers named in ``non_root`` run as
    OPERATOR_UID, with runAsNonRoot."""
    pod_spec["automountServiceAccountToken"] = False
    pod_sc = pod_spec.setdefault("securityContext", {})
    pod_sc["seccompProfile"] = {"type": "RuntimeDefault"}
    for c in [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]:
        sc = c.setdefault("securityContext", {})
        sc.pop("privileged", None)
        # A container's own profile overrides the pod's: the renderer's seccomp Unconfined for ROCm
        # engines (inferasim.render_pod) gives way to the pod's RuntimeDefault here.
        sc.pop("seccompProfile", None)
        sc["allowPrivilegeEscalation"] = False
        sc["capabilities"] = {"drop": ["ALL"]}
        if c.get("name") in non_root:
            sc["runAsNonRoot"] = True
            sc["runAsUser"] = OPERATOR_UID
            sc["runAsGroup"] = OPERATOR_UID
    return pod_spec


def is_restricted(pod_spec: dict[str, Any]) -> list[str]:
    """What in ``pod_spec`` falls short of :func:`harden_pod` (empty: nothing)."""
    out = []
    if pod_spec.get("automountServiceAccountToken") is not False:
        out.append("automountServiceAccountToken is not false")
    if ((pod_spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        out.append("seccompProfile is not RuntimeDefault")
    for c in [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]:
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False or sc.get("privileged"):
            out.append(f"{c.get('name')}: privilege escalation allowed")
        if (sc.get("seccompProfile") or {}).get("type") not in (None, "RuntimeDefault"):
            out.append(f"{c.get('name')}: seccompProfile is not RuntimeDefault")
        if (sc.get("capabilities") or {}).get("drop") != ["ALL"] or (sc.get("capabilities") or {}).get("add"):
            out.append(f"{c.get('name')}: capabilities not all dropped")
    return out
