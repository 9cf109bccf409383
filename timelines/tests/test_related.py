"""Relations between objects (issue 19 item 2): ``GET /api/v1/incidents/{id}/related/`` and the
events filter ``related=R/N/X``, from the snapshots of the must-gather's objects and from a
story written out here (a custom resource, its StatefulSet, the pod, its claim and volume)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
import yaml

from timelines.models import Event

pytestmark = pytest.mark.django_db

BUNDLES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "bundles"
NAMESPACE = "openshift-ingress-operator"
FILES = ("core/pods.yaml", "apps/replicasets.yaml", "apps/deployments.yaml",
         "core/endpoints.yaml", "core/services.yaml")


@pytest.fixture(scope="module")
def namespace_files(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("ingress")
    found = {}
    with tarfile.open(BUNDLES / "openshift-must-gather-aws.tar.xz") as tar:
        for member in tar:
            for name in FILES:
                if member.isfile() and member.name.endswith(f"/namespaces/{NAMESPACE}/{name}"):
                    target = out / name.replace("/", "-")
                    target.write_bytes(tar.extractfile(member).read())
                    found[name] = target
    assert set(found) == set(FILES)
    return found


def items(path: Path) -> list[dict]:
    return yaml.load(path.read_bytes(), Loader=yaml.CSafeLoader)["items"]


def related(api, incident, **params) -> dict:
    answer = api(f"/api/v1/incidents/{incident.pk}/related/", params)
    assert answer.status_code == 200, answer.content
    return answer.json()


def test_a_pod_is_related_to_its_owners_node_and_service(namespace_files, incident, ingest_file,
                                                         api):
    for path in namespace_files.values():
        assert ingest_file(incident, path).status == "done"
    replicasets = {r["metadata"]["name"]: r
                   for r in items(namespace_files["apps/replicasets.yaml"])}
    endpoints = items(namespace_files["core/endpoints.yaml"])
    pods = items(namespace_files["core/pods.yaml"])
    assert pods
    for pod in pods:
        meta = pod["metadata"]
        expected = {("nodes", "", pod["spec"]["nodeName"], "node")}
        for owner in meta.get("ownerReferences") or []:
            expected.add(("replicasets", NAMESPACE, owner["name"], "owner"))
            for up in replicasets[owner["name"]]["metadata"].get("ownerReferences") or []:
                expected.add(("deployments", NAMESPACE, up["name"], "owner"))
        for found in endpoints:
            for subset in found.get("subsets") or []:
                for address in subset.get("addresses") or []:
                    if (address.get("targetRef") or {}).get("name") == meta["name"]:
                        expected.add(("endpoints", NAMESPACE, found["metadata"]["name"],
                                      "endpoints"))
                        expected.add(("services", NAMESPACE, found["metadata"]["name"],
                                      "service"))
        answer = related(api, incident, resource="pods", namespace=NAMESPACE, name=meta["name"])
        assert answer["object"] == {"resource": "pods", "namespace": NAMESPACE,
                                    "name": meta["name"], "uid": meta["uid"]}
        assert {(r["resource"], r["namespace"], r["name"], r["relation"])
                for r in answer["related"]} == expected
        assert len(expected) >= 4  # node, replica set, deployment, and the metrics service

    # The deployment owns its replica sets and, through them, their pods.
    deployment = items(namespace_files["apps/deployments.yaml"])[0]["metadata"]["name"]
    answer = related(api, incident, resource="deployments", namespace=NAMESPACE, name=deployment)
    owned = {(r["resource"], r["name"]) for r in answer["related"] if r["relation"] == "owned"}
    assert owned == {("replicasets", n) for n, r in replicasets.items()
                     if any(o["name"] == deployment
                            for o in r["metadata"].get("ownerReferences") or [])} | {
        ("pods", p["metadata"]["name"]) for p in pods}


STORY = """
apiVersion: db.example.com/v1
kind: Instance
metadata: {name: orders, namespace: shop, uid: i-1, creationTimestamp: "2024-03-01T10:00:00Z"}
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: orders-db
  namespace: shop
  uid: s-1
  creationTimestamp: "2024-03-01T10:00:01Z"
  ownerReferences: [{apiVersion: db.example.com/v1, kind: Instance, name: orders, uid: i-1}]
---
apiVersion: v1
kind: Pod
metadata:
  name: orders-db-0
  namespace: shop
  uid: p-1
  creationTimestamp: "2024-03-01T10:00:02Z"
  ownerReferences: [{apiVersion: apps/v1, kind: StatefulSet, name: orders-db, uid: s-1}]
spec:
  nodeName: worker-1
  volumes: [{name: data, persistentVolumeClaim: {claimName: data-orders-db-0}}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data-orders-db-0, namespace: shop, uid: c-1,
           creationTimestamp: "2024-03-01T10:00:02Z"}
spec: {volumeName: pvc-c-1}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: pvc-c-1, uid: v-1, creationTimestamp: "2024-03-01T10:00:03Z"}
spec: {claimRef: {namespace: shop, name: data-orders-db-0}}
---
apiVersion: v1
kind: Pod
metadata: {name: unrelated, namespace: shop, uid: p-2, creationTimestamp: "2024-03-01T10:00:04Z"}
spec: {nodeName: worker-2}
"""


def test_the_deadlock_story_is_one_selection(tmp_path, incident, ingest_file, api):
    path = tmp_path / "story.yaml"
    path.write_text(STORY)
    assert ingest_file(incident, path).status == "done"
    objects = [d for d in yaml.safe_load_all(STORY) if d]

    answer = related(api, incident, resource="instances", namespace="shop", name="orders")

    assert answer["object"]["uid"] == "i-1"
    assert [(r["resource"], r["name"], r["relation"]) for r in answer["related"]] == [
        ("statefulsets", "orders-db", "owned"), ("pods", "orders-db-0", "owned"),
        ("nodes", "worker-1", "node"), ("persistentvolumeclaims", "data-orders-db-0", "claim"),
        ("persistentvolumes", "pvc-c-1", "volume")]
    # The filter selects the same objects' events, and nothing of the unrelated pod.
    listed = api(f"/api/v1/incidents/{incident.pk}/events/",
                 {"related": "instances/shop/orders", "reason": "Snapshot"}).json()["results"]
    story = {(o["kind"].lower() + "s", o["metadata"]["name"]) for o in objects[:5]}
    assert {(e["resource"], e["name"]) for e in listed} == story
    assert ("pods", "unrelated") not in story
    # The volume, cluster-scoped, knows its claim the other way round.
    answer = related(api, incident, resource="persistentvolumes", name="pvc-c-1")
    assert ("persistentvolumeclaims", "data-orders-db-0", "claim") in {
        (r["resource"], r["name"], r["relation"]) for r in answer["related"]}
    assert api(f"/api/v1/incidents/{incident.pk}/events/",
               {"related": "persistentvolumes/pvc-c-1"}).status_code == 200
    assert api(f"/api/v1/incidents/{incident.pk}/events/",
               {"related": "a/b/c/d"}).status_code == 400
    assert Event.objects.filter(incident=incident, kind="state", name="unrelated").exists()


@pytest.mark.django_db(transaction=True)
def test_the_event_detail_lists_related_objects_and_selects_them(open_page, owner, incident,
                                                                 ingest_file, tmp_path):
    from hindsight.testing import wait_for_detail

    path = tmp_path / "story.yaml"
    path.write_text(STORY)
    assert ingest_file(incident, path).status == "done"
    pod = Event.objects.get(incident=incident, reason="Snapshot", name="orders-db-0")
    page = open_page(owner, f"/incidents/{incident.pk}/?event={pod.pk}")
    wait_for_detail(page, pod.pk)

    page.wait_for_selector("#related-list li")
    listed = page.eval_on_selector_all(
        "#related-list li", "items => items.map(i => [i.dataset.relation, i.textContent])")
    assert listed == [["owner", "owner: statefulsets/shop/orders-db"],
                      ["owner", "owner: instances/shop/orders"],
                      ["node", "node: nodes/worker-1"],
                      ["claim", "claim: persistentvolumeclaims/shop/data-orders-db-0"],
                      ["volume", "volume: persistentvolumes/pvc-c-1"]]
    assert "related=pods%2Fshop%2Forders-db-0" in page.get_attribute("#link-related", "href")
    # the snapshot is a version of the pod in the versions table
    page.wait_for_selector("#versions-table tbody tr")
    assert page.eval_on_selector_all("#versions-table tbody tr",
                                     "rows => rows.map(r => Number(r.dataset.event))") == [pod.pk]


def test_an_object_without_a_snapshot_is_related_by_its_audit_bodies(tmp_path, incident,
                                                                     ingest_file, api):
    import json

    pod = {"kind": "Pod", "apiVersion": "v1", "metadata": {
        "name": "web-0", "namespace": "shop", "uid": "u-web-0",
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web"}]},
        "spec": {"nodeName": "n1", "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}}]}}
    event = {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "RequestResponse",
             "auditID": "a-1", "stage": "ResponseComplete", "verb": "update",
             "requestURI": "/api/v1/namespaces/shop/pods/web-0",
             "user": {"username": "kubelet"},
             "objectRef": {"resource": "pods", "namespace": "shop", "name": "web-0",
                           "apiVersion": "v1"},
             "responseStatus": {"code": 200}, "responseObject": pod,
             "requestReceivedTimestamp": "2024-03-01T10:00:00.000000Z",
             "stageTimestamp": "2024-03-01T10:00:00.004000Z"}
    path = tmp_path / "audit.log"
    path.write_text(json.dumps(event) + "\n")
    assert ingest_file(incident, path).status == "done"

    answer = related(api, incident, resource="pods", namespace="shop", name="web-0")

    assert answer["object"]["uid"] == "u-web-0"
    assert [(r["resource"], r["namespace"], r["name"], r["relation"])
            for r in answer["related"]] == [
        ("statefulsets", "shop", "web", "owner"), ("nodes", "", "n1", "node"),
        ("persistentvolumeclaims", "shop", "data-web-0", "claim")]
