"""The kubeconfig that kube-apiserver's ``--audit-webhook-config-file`` reads, and its flags."""

from __future__ import annotations

from .models import Stream

FLAGS = [
    "--audit-policy-file=/etc/kubernetes/audit-policy.yaml",
    "--audit-webhook-config-file=/etc/kubernetes/hindsight-audit-webhook.yaml",
    "--audit-webhook-mode=batch",
    "--audit-webhook-batch-max-size=400",
    "--audit-webhook-version=audit.k8s.io/v1",
]


def kubeconfig(stream: Stream, server: str, token: str) -> str:
    """YAML (written by hand: a fixed shape, values quoted as JSON strings, which YAML reads)."""
    import json

    name = f"hindsight-stream-{stream.pk}"
    return (
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        f"- name: {name}\n"
        "  cluster:\n"
        f"    server: {json.dumps(server)}\n"
        "contexts:\n"
        f"- name: {name}\n"
        "  context:\n"
        f"    cluster: {name}\n"
        f"    user: {name}\n"
        f"current-context: {name}\n"
        "users:\n"
        f"- name: {name}\n"
        "  user:\n"
        f"    token: {json.dumps(token)}\n"
    )


def apiserver_flags() -> list[str]:
    return list(FLAGS)
