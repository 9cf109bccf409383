"""Objects related to an object of an incident: owners and what they own, a pod's node, claims and
volumes, a Service's Endpoints and pods, read from the relations its snapshots name
(``timelines.parsers.events.state.relations``, kept in each ``Snapshot`` row's
``annotations.related``) and their inverse, and for an object the answer reaches that has no
snapshot, from the latest version of it an audit body stored (what it names, not what names it:
finding those would read every body of the incident).

``related_objects`` answers ``GET /api/v1/incidents/{id}/related/`` and the events filter
``related=R/N/X``: the object's ancestors (owner of owner…), its descendants (what it owns, and
what those own…), and for the object and each descendant its node, claims (with their volumes),
Services, Endpoints and pods, so that one selection holds a whole story (a custom resource, its
StatefulSet, the pod, its PersistentVolumeClaim and the bound PersistentVolume).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from django.db.models import Q, QuerySet

from ..models import Event
from ..parsers.events.state import relations
from .diff import NoVersion, object_version

Key = tuple[str, str, str]  # resource, namespace, name

# The relation seen from the other end of an edge that an object names.
INVERSE = {"owner": "owned", "node": "pod", "claim": "pod", "volume": "claim",
           "service": "endpoints", "pod": "endpoints"}
# A PersistentVolume names its claim: seen from the claim, that is its volume.
INVERSE_BY_RESOURCE = {("persistentvolumes", "claim"): "volume"}
NEIGHBOURS = ("node", "claim", "volume", "service", "endpoints", "pod")
MAX_FILLS = 50  # objects of one answer whose audit bodies may be read
AUDIT_TRIES = 5  # of an object's latest requests, how many may be read for a version


class Graph:
    """The relations of an incident's snapshots, both ways."""

    def __init__(self, rows: Iterable[tuple[str, str, str, str, dict]],
                 fill: Callable[[Key], tuple[str, list[list[str]]]] | None = None) -> None:
        self.uids: dict[Key, str] = {}
        self.edges: dict[Key, list[tuple[str, Key]]] = defaultdict(list)
        # What an object without a snapshot names, from elsewhere (its audit bodies): asked
        # for each object the answer reaches, at most MAX_FILLS times.
        self.fill = fill
        self.known: set[Key] = set()
        self.fills = 0
        for resource, namespace, name, uid, notes in rows:
            key = (resource, namespace, name)
            self.known.add(key)
            if uid:
                self.uids.setdefault(key, uid)
            self._name(key, (notes or {}).get("related") or [])
        # A pod behind a Service's Endpoints belongs to that Service, and the Service has it.
        for endpoints, found in list(self.edges.items()):
            if endpoints[0] not in ("endpoints", "endpointslices"):
                continue
            services = [other for relation, other in found if relation == "service"]
            pods = [other for relation, other in found if relation == "pod"]
            for service in services:
                for pod in pods:
                    self._add(pod, "service", service)
                    self._add(service, "pod", pod)

    def _name(self, key: Key, related: list[list[str]]) -> None:
        """``key`` names ``related`` (``[relation, resource, namespace, name]``): both ways."""
        for relation, other_resource, other_namespace, other_name in related:
            other = (other_resource, other_namespace, other_name)
            self._add(key, relation, other)
            inverse = INVERSE_BY_RESOURCE.get((key[0], relation)) or INVERSE.get(
                relation, f"{relation}-of")
            self._add(other, inverse, key)

    def _edges(self, key: Key) -> list[tuple[str, Key]]:
        if key not in self.known and self.fill is not None and self.fills < MAX_FILLS:
            self.known.add(key)
            self.fills += 1
            uid, related = self.fill(key)
            if uid:
                self.uids.setdefault(key, uid)
            self._name(key, related)
        return self.edges[key]

    def _add(self, key: Key, relation: str, other: Key) -> None:
        if (relation, other) not in self.edges[key] and other != key:
            self.edges[key].append((relation, other))

    def related(self, key: Key) -> list[tuple[str, Key]]:
        """(relation, object) of everything related to ``key``, each once, nearest first."""
        seen = {key}
        out: list[tuple[str, Key]] = []

        def take(relation: str, other: Key) -> bool:
            if other in seen:
                return False
            seen.add(other)
            out.append((relation, other))
            return True

        # up: owners of owners
        frontier = [key]
        while frontier:
            frontier = [other for current in frontier for relation, other in self._edges(current)
                        if relation == "owner" and take("owner", other)]
        # down: what it owns, and what those own
        family = [key]
        frontier = [key]
        while frontier:
            frontier = [other for current in frontier for relation, other in self._edges(current)
                        if relation == "owned" and take("owned", other)]
            family.extend(frontier)
        # beside: node, claims and their volumes, Services, Endpoints and pods
        for member in family:
            for relation, other in list(self._edges(member)):
                if relation in NEIGHBOURS and take(relation, other) and relation == "claim":
                    for inner, volume in self._edges(other):
                        if inner == "volume":
                            take("volume", volume)
        return out


def graph_of(events: QuerySet) -> Graph:
    """The relation graph of ``events`` (an incident's): what its snapshots name, and for an
    object without one that the answer reaches, what its latest stored version in an audit
    body names."""
    rows = events.filter(kind=Event.Kind.STATE, reason="Snapshot",
                         annotations__has_key="related").values_list(
        "resource", "namespace", "name", "object_uid", "annotations")
    return Graph(rows.iterator(chunk_size=2000), lambda key: audit_relations(events, key))


def audit_relations(events: QuerySet, key: Key) -> tuple[str, list[list[str]]]:
    """The uid and what the latest object version among ``key``'s successful audit requests
    names (``state.relations``); ("", []) when no request stored one."""
    requests = events.filter(kind=Event.Kind.AUDIT, resource=key[0], namespace=key[1],
                             name=key[2], subresource="", code__gte=200, code__lt=300,
                             body_chunk__isnull=False).exclude(level__in=["Metadata", "None"])
    for event in requests.order_by("-received", "-id")[:AUDIT_TRIES]:
        try:
            version = object_version(event.body())
        except NoVersion:
            continue
        uid = (version.get("metadata") or {}).get("uid")
        return uid if isinstance(uid, str) else "", relations(version, key[0], key[1])
    return "", []


def related_objects(events: QuerySet, key: Key) -> dict:
    """``{"object": {"resource", "namespace", "name", "uid"}, "related": [{"resource",
    "namespace", "name", "relation"}]}`` for ``key`` among ``events`` (an incident's)."""
    graph = graph_of(events)
    related = graph.related(key)  # reads the audit bodies of objects without a snapshot
    uid = graph.uids.get(key) or next(iter(
        events.filter(resource=key[0], namespace=key[1], name=key[2]).exclude(object_uid="")
        .values_list("object_uid", flat=True)[:1]), "")
    return {"object": {"resource": key[0], "namespace": key[1], "name": key[2], "uid": uid},
            "related": [{"resource": other[0], "namespace": other[1], "name": other[2],
                         "relation": relation} for relation, other in related]}


def parse_related(value: str) -> Key:
    """``R/N/X`` (namespaced) or ``R/X`` (cluster-scoped) as a key; ValueError otherwise."""
    parts = value.split("/")
    if len(parts) == 2 and all(parts):
        return parts[0], "", parts[1]
    if len(parts) == 3 and parts[0] and parts[2]:
        return parts[0], parts[1], parts[2]
    raise ValueError(f"{value!r}: give resource/namespace/name, or resource/name for a "
                     "cluster-scoped object")


def related_filter(events: QuerySet, keys: Iterable[Key]) -> Q:
    """The events of each object of ``keys`` and of everything related to it."""
    graph = graph_of(events)
    wanted: set[Key] = set()
    for key in keys:
        wanted.add(key)
        wanted.update(other for _, other in graph.related(key))
    condition = Q(pk__in=[])
    for resource, namespace, name in sorted(wanted):
        condition |= Q(resource=resource, namespace=namespace, name=name)
    return condition
