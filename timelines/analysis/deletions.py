"""The ``deletion`` and ``recreated-object`` insights (``timelines.analysis.insights``): who
deleted what and when, namespaces and the time their contents were actually removed, what the
garbage collector removed because of an owner's deletion, finalizer removals, and objects
created again under a name deleted earlier."""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import timedelta

from django.db import connection
from django.db.models import (
    Case,
    Count,
    F,
    Max,
    Min,
    Q,
    QuerySet,
    RowRange,
    TextField,
    Value,
    When,
    Window,
)
from django.db.models.functions import Collate, FirstValue, Lag

from incidents.notes import format_duration, format_time

from . import columnar
from .common import (
    MAX_BODIES,
    MAX_EVENTS,
    MAX_GROUPS,
    MAX_LISTED,
    STATUS_OK,
    count_of,
    insight,
    metadata_of,
    ms,
    object_label,
    plural,
    read_bodies,
    requests_of,
    rfc3339,
)

GC_USER = "system:serviceaccount:kube-system:generic-garbage-collector"
GC_WINDOW = timedelta(minutes=10)  # an owner deletion this far back may explain a GC delete
MAX_NAMESPACES = 20
UID_PAIRS = 3  # re-creations of an object whose UIDs are read from the bodies (the last ones)


def steps(events: QuerySet, requests: Callable[[], columnar.Requests | None] = lambda: None
          ) -> list[tuple[str, Callable[[], list[dict]]]]:
    """(name, the function finding them) for the deletion and recreated-object insights of
    ``events`` (one incident's); ``requests()``: its requests in its column index, if any."""
    return [("namespaces", lambda: namespace_insights(namespace_rows(events))),
            ("garbage collector", lambda: garbage_insights(*garbage_rows(events))),
            ("finalizers", lambda: finalizer_insights(finalizer_rows(events, requests()))),
            ("by actor", lambda: deletion_group_insights(deletion_groups(events, requests()))),
            ("recreated-object", lambda: recreated_insights(*recreated_rows(events,
                                                                             requests())))]


# --- deletion -------------------------------------------------------------------------------------

_DELETE_FIELDS = ("id", "received", "username", "verb", "resource", "namespace", "name",
                  "object_uid", "level", "body_chunk", "body_index")


def _deletes(events: QuerySet) -> QuerySet:
    return requests_of(events).filter(STATUS_OK, verb__in=("delete", "deletecollection"))


def deletion_groups(events: QuerySet, requests: columnar.Requests | None = None) -> list[dict]:
    """Successful deletes by people and controllers other than the garbage collector, of
    anything but namespaces, grouped by (actor, resource): ``username``, ``resource``,
    ``count``, ``first``, ``last``, ``deletes`` (the first MAX_EVENTS in time order). The
    groups counted on the column index ``requests`` when given; the most deletes first, then
    by user and resource (in Python: one order whatever the database's collation)."""
    deletes = _deletes(events).exclude(username=GC_USER).exclude(resource="namespaces")
    every = columnar.delete_groups(requests, GC_USER, MAX_EVENTS) if requests is not None else (
        list(deletes.order_by().values("username", "resource").annotate(
            count=Count("id"), first=Min("received"), last=Max("received"))))
    groups = sorted(every, key=lambda g: (-g["count"], g["username"], g["resource"]))[
        :MAX_GROUPS]
    for group in groups:
        if "ids" in group:  # by primary key alone: with an order, the planner walks by time
            group["deletes"] = sorted(events.filter(pk__in=group.pop("ids")).order_by().values(
                *_DELETE_FIELDS), key=lambda d: (d["received"], d["id"]))
        else:
            group["deletes"] = list(deletes.filter(
                username=group["username"], resource=group["resource"]).order_by(
                "received", "id").values(*_DELETE_FIELDS)[:MAX_EVENTS])
    return groups


def deletion_group_insights(groups: list[dict]) -> list[dict]:
    found = []
    for group in groups:
        user = group["username"] or "(unknown user)"
        names = [object_label("", d["namespace"], d["name"]) or "(a collection)"
                 for d in group["deletes"][:3]]
        span = "" if group["first"] == group["last"] else (
            f" over {format_duration(ms(group['last'] - group['first']))}")
        found.append(insight(
            "deletion", f"{user} deleted {count_of(group['count'], group['resource'])}",
            "info",
            f"from {format_time(group['first'])}{span}: {', '.join(names)}"
            + ("…" if group["count"] > len(names) else ""),
            [d["id"] for d in group["deletes"]], event_count=group["count"],
            user=group["username"], resource=group["resource"], count=group["count"],
            deletes=[{"event": d["id"], "at": rfc3339(d["received"]), "verb": d["verb"],
                      "namespace": d["namespace"], "name": d["name"]}
                     for d in group["deletes"][:MAX_LISTED]],
            filters={"user": [group["username"]], "resource": [group["resource"]],
                     "verb": ["delete", "deletecollection"]}))
    return found


def namespace_rows(events: QuerySet) -> list[dict]:
    """The latest successful deletion of each deleted namespace (at most MAX_NAMESPACES, the
    latest first), each with what followed it in the namespace until it was created again:
    ``after`` (events), ``last`` (received), ``last_delete`` and ``removed`` (ids of the
    deletes there, at most MAX_EVENTS)."""
    deletions = list(_deletes(events).filter(resource="namespaces", verb="delete").order_by(
        "-received", "-id").values("id", "received", "username", "name")[:MAX_NAMESPACES * 5])
    latest: dict[str, dict] = {}
    for row in deletions:
        latest.setdefault(row["name"], row)
    rows = list(latest.values())[:MAX_NAMESPACES]
    if not rows:
        return []
    creates = dict(requests_of(events).filter(
        STATUS_OK, resource="namespaces", verb="create", name__in=[r["name"] for r in rows])
        .order_by().values("name").annotate(last=Max("received")).values_list("name", "last"))
    within = Q()
    for row in rows:
        until = creates.get(row["name"])
        row["until"] = until if until and until > row["received"] else None
        window = Q(received__gt=row["received"])
        if row["until"]:
            window &= Q(received__lt=row["until"])
        within |= window & (Q(namespace=row["name"]) & ~Q(resource="namespaces")
                            | Q(resource="namespaces", name=row["name"]))
    inside = events.filter(within)
    counted = {r["namespace"] or r["name"]: r for r in inside.annotate(
        ns=Case(When(resource="namespaces", then=F("name")), default=F("namespace"))
    ).order_by().values("ns").annotate(
        after=Count("id"), last=Max("received"),
        last_delete=Max("received", filter=Q(verb="delete") & STATUS_OK),
    ).values("ns", "after", "last", "last_delete", namespace=F("ns"), name=F("ns"))}
    removed = defaultdict(list)
    for event_id, namespace, name, resource in inside.filter(
            STATUS_OK, verb__in=("delete", "deletecollection")).order_by(
            "received", "id").values_list("id", "namespace", "name", "resource")[
            :MAX_EVENTS * len(rows)]:
        removed[name if resource == "namespaces" else namespace].append(event_id)
    for row in rows:
        facts = counted.get(row["name"], {})
        row["after"] = facts.get("after", 0)
        row["last"] = facts.get("last")
        row["last_delete"] = facts.get("last_delete")
        row["removed"] = removed[row["name"]][:MAX_EVENTS]
    return sorted(rows, key=lambda r: (r["received"], r["id"]))


def namespace_insights(rows: list[dict]) -> list[dict]:
    found = []
    for row in rows:
        removed_at = row["last_delete"] or row["last"]
        if removed_at is None:
            tail = ("no later event in the namespace: when its contents went is not in the "
                    "evidence")
        else:
            later = format_duration((removed_at - row["received"]) / timedelta(milliseconds=1))
            tail = (f"its contents were removed until {format_time(removed_at)}, {later} "
                    f"later ({plural(len(row['removed']), 'delete')}, "
                    f"{plural(row['after'], 'event')} after it)")
        found.append(insight(
            "deletion", f"Namespace {row['name']} deleted by {row['username'] or '(unknown)'}",
            "warning", f"at {format_time(row['received'])}; {tail}"
            + (f"; created again at {format_time(row['until'])}" if row["until"] else ""),
            [row["id"], *row["removed"]], event_count=1 + len(row["removed"]),
            namespace=row["name"], user=row["username"], at=rfc3339(row["received"]),
            contents_removed_at=rfc3339(removed_at), events_after=row["after"],
            recreated_at=rfc3339(row["until"])))
    return found


def _resource_of(kind: str) -> str:
    """A kind's usual resource name: Deployment → deployments, Ingress → ingresses,
    NetworkPolicy → networkpolicies."""
    word = kind.lower()
    if word.endswith("s") or word.endswith("x"):
        return word + "es"
    if word.endswith("y") and word[-2:-1] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def garbage_rows(events: QuerySet) -> tuple[list[dict], list[dict], dict[int, dict]]:
    """(the garbage collector's successful deletes, at most MAX_BODIES; the other deletes that
    may have caused them; the owner references by GC delete id, from the bodies of the deleted
    objects where stored: the delete's own, else the object's latest stored version)."""
    collected = list(_deletes(events).filter(username=GC_USER).order_by("received", "id").values(
        *_DELETE_FIELDS)[:MAX_BODIES])
    if not collected:
        return [], [], {}
    first = collected[0]["received"] - GC_WINDOW
    owners = list(_deletes(events).exclude(username=GC_USER).filter(
        received__gte=first, received__lte=collected[-1]["received"]).order_by(
        "received", "id").values(*_DELETE_FIELDS)[:MAX_BODIES * 5])
    versions = list(requests_of(events).filter(
        level__in=("Request", "RequestResponse"), verb__in=("create", "update", "patch", "get"),
        name__in={c["name"] for c in collected}, resource__in={c["resource"] for c in collected},
        received__lte=collected[-1]["received"]).order_by("-received", "-id").values(
        "id", "resource", "namespace", "name", "body_chunk", "body_index")[:MAX_BODIES])
    latest: dict[tuple, dict] = {}
    for version in versions:
        latest.setdefault((version["resource"], version["namespace"], version["name"]), version)
    bodies = read_bodies([*collected, *latest.values()])
    references = {}
    for gc in collected:
        refs = (metadata_of(bodies.get(gc["id"]), "responseObject").get("ownerReferences")
                or metadata_of(bodies.get(gc["id"]), "requestObject").get("ownerReferences"))
        version = latest.get((gc["resource"], gc["namespace"], gc["name"]))
        if not refs and version is not None:
            body = bodies.get(version["id"])
            refs = (metadata_of(body, "responseObject").get("ownerReferences")
                    or metadata_of(body, "requestObject").get("ownerReferences"))
        if isinstance(refs, list) and refs and isinstance(refs[0], dict):
            references[gc["id"]] = next((r for r in refs if r.get("controller")), refs[0])
    return collected, owners, references


def link_garbage(collected: list[dict], owners: list[dict],
                 references: dict[int, dict]) -> tuple[dict[int, list[tuple[dict, str]]],
                                                       list[dict]]:
    """Each garbage-collector delete linked to the owner deletion that caused it: by its owner
    reference (the owner's UID, else kind and name) when the bodies hold one, else the latest
    other delete in the same namespace within GC_WINDOW before it; an owner that the collector
    deleted itself leads on to its own owner. Returns ({owner delete id: [(gc delete, how)]},
    the GC deletes left without an owner)."""
    by_uid = {o["object_uid"]: o for o in owners if o["object_uid"]}
    by_name = {(o["resource"], o["namespace"], o["name"]): o for o in owners}
    gc_by_uid = {g["object_uid"]: g for g in collected if g["object_uid"]}
    gc_by_name = {(g["resource"], g["namespace"], g["name"]): g for g in collected}
    grouped = defaultdict(list)
    for row in owners:
        grouped[row["namespace"]].append(row)
    in_namespace = {ns: ([r["received"] for r in rows], rows) for ns, rows in grouped.items()}
    parent: dict[int, tuple[dict, str]] = {}
    for gc in collected:
        reference = references.get(gc["id"])
        owner, how = None, ""
        if reference:
            key = (_resource_of(str(reference.get("kind", ""))), gc["namespace"],
                   str(reference.get("name", "")))
            uid = str(reference.get("uid", ""))
            owner = (by_uid.get(uid) or gc_by_uid.get(uid) or by_name.get(key)
                     or gc_by_name.get(key))
            how = "ownerReferences"
        if owner is None:
            times, rows = in_namespace.get(gc["namespace"], ((), ()))
            at = bisect_right(times, gc["received"])  # owners are in time order
            if at and gc["received"] - rows[at - 1]["received"] <= GC_WINDOW:
                owner = rows[at - 1]
            how = "time and namespace"
        if owner is not None and owner["id"] != gc["id"] and owner["received"] <= gc["received"]:
            parent[gc["id"]] = (owner, how)
    linked: dict[int, list[tuple[dict, str]]] = defaultdict(list)
    orphans = []
    for gc in collected:
        root, how, seen = parent.get(gc["id"]), "", {gc["id"]}
        if root is not None:
            how = root[1]
            while root[0]["username"] == GC_USER and root[0]["id"] in parent \
                    and root[0]["id"] not in seen:
                seen.add(root[0]["id"])
                root = parent[root[0]["id"]]
        if root is None or root[0]["username"] == GC_USER:
            orphans.append(gc)
        else:
            linked[root[0]["id"]].append((gc, how))
    return linked, orphans


def garbage_insights(collected: list[dict], owners: list[dict],
                     references: dict[int, dict]) -> list[dict]:
    linked, orphans = link_garbage(collected, owners, references)
    owner_rows = {o["id"]: o for o in owners}
    found = []
    for owner_id, items in sorted(linked.items(), key=lambda kv: owner_rows[kv[0]]["received"]):
        owner = owner_rows[owner_id]
        kinds = Counter(gc["resource"] for gc, _ in items)
        what = ", ".join(count_of(n, r) for r, n in kinds.most_common())
        hows = sorted({how for _, how in items})
        found.append(insight(
            "deletion",
            f"Deleting {object_label(owner['resource'], owner['namespace'], owner['name'])} "
            f"made the garbage collector delete {what}",
            "warning",
            f"{owner['username'] or '(unknown user)'} deleted it at "
            f"{format_time(owner['received'])}; linked by {' and '.join(hows)}",
            [owner["id"], *(gc["id"] for gc, _ in items)],
            owner={"event": owner["id"], "resource": owner["resource"],
                   "namespace": owner["namespace"], "name": owner["name"],
                   "user": owner["username"], "at": rfc3339(owner["received"])},
            collected=[{"event": gc["id"], "resource": gc["resource"],
                        "namespace": gc["namespace"], "name": gc["name"],
                        "at": rfc3339(gc["received"]), "linked_by": how}
                       for gc, how in items][:MAX_LISTED]))
    if orphans:
        found.append(insight(
            "deletion", f"The garbage collector deleted {plural(len(orphans), 'object')} "
            "whose owner's deletion is not in the evidence", "info",
            "no owner reference in the stored bodies and no other delete in the same namespace "
            f"within {format_duration(GC_WINDOW / timedelta(milliseconds=1))} before",
            [gc["id"] for gc in orphans], user=GC_USER))
    return found


def finalizer_rows(events: QuerySet, requests: columnar.Requests | None = None) -> list[dict]:
    """Updates and patches (with bodies: Request or RequestResponse level) of objects deleted in
    the incident, from their first deletion on, with their bodies: where finalizers are
    emptied. The deleted objects (the first MAX_BODIES deleted) and the writes that may be
    theirs found on the column index ``requests`` when given."""
    if requests is not None:
        first, ids = columnar.finalizer_candidates(requests, MAX_BODIES, MAX_BODIES * 2)
        if not first:
            return []
        candidates = sorted(events.filter(pk__in=ids).order_by().values(*_WRITE_FIELDS),
                            key=lambda w: (w["received"], w["id"]))
    else:
        deleted = list(_deletes(events).filter(verb="delete").exclude(name="").order_by()
                       .values("resource", "namespace", "name").annotate(
            first=Min("received")).order_by("first", "resource", "namespace", "name")[
            :MAX_BODIES])
        if not deleted:
            return []
        first = {(d["resource"], d["namespace"], d["name"]): d["first"] for d in deleted}
        candidates = requests_of(events).filter(
            STATUS_OK, verb__in=("update", "patch"), level__in=("Request", "RequestResponse"),
            name__in={d["name"] for d in deleted}, resource__in={d["resource"] for d in deleted},
            received__gte=min(first.values())).order_by("received", "id").values(
            *_WRITE_FIELDS)[:MAX_BODIES * 2]
    writes = [w for w in candidates
              if (w["resource"], w["namespace"], w["name"]) in first
              and w["received"] >= first[(w["resource"], w["namespace"], w["name"])]][
        :MAX_BODIES]
    bodies = read_bodies(writes)
    for write in writes:
        write["body"] = bodies.get(write["id"])
        write["deleted_at"] = first[(write["resource"], write["namespace"], write["name"])]
    return writes


def empties_finalizers(body: dict | None) -> bool:
    """Whether a stored update or patch leaves the object without finalizers: the request sets
    ``metadata.finalizers`` to [] or null (or a JSON patch removes or empties it), or the object
    stored after it has none where the request named them."""
    if not body:
        return False
    request = body.get("requestObject")
    if isinstance(request, list):  # a JSON patch
        return any(isinstance(op, dict) and op.get("path") == "/metadata/finalizers" and (
            op.get("op") == "remove" or (op.get("op") in ("replace", "add")
                                         and not op.get("value"))) for op in request)
    if isinstance(request, dict) and isinstance(request.get("metadata"), dict) \
            and "finalizers" in request["metadata"]:
        if not request["metadata"]["finalizers"]:
            return True
        response = metadata_of(body, "responseObject")
        return bool(response) and not response.get("finalizers")
    return False


_WRITE_FIELDS = ("id", "received", "username", "verb", "resource", "subresource", "namespace",
                 "name", "body_chunk", "body_index")


def finalizer_insights(writes: list[dict]) -> list[dict]:
    found = []
    for write in [w for w in writes if empties_finalizers(w["body"])][:MAX_GROUPS]:
        after = format_duration((write["received"] - write["deleted_at"])
                                / timedelta(milliseconds=1))
        found.append(insight(
            "deletion",
            f"Finalizers of {object_label(write['resource'], write['namespace'], write['name'])} "
            f"removed by {write['username'] or '(unknown user)'}",
            "info",
            f"a {write['verb']} at {format_time(write['received'])} emptied "
            f"metadata.finalizers, {after} after its deletion was asked: then it went",
            [write["id"]], user=write["username"], at=rfc3339(write["received"]),
            finalizers_removed=True))
    return found


# --- recreated-object ---------------------------------------------------------------------------

def recreated_rows(events: QuerySet, requests: columnar.Requests | None = None
                   ) -> tuple[list[dict], dict[int, dict]]:
    """Successful creates whose object (resource, namespace, name; a namespace by its name) was
    last deleted, not created, before them, with that delete: at most MAX_BODIES, in time order;
    and the delete rows by id. One window pass over the creates and deletes, or the same on the
    column index ``requests`` when given."""
    found = (columnar.recreations(requests) if requests is not None
             else _recreations(events))[:MAX_BODIES]
    if not found:
        return [], {}
    pairs = {create_id: delete_id for _, create_id, delete_id in found}
    creates = list(events.filter(pk__in=pairs).order_by("received", "id").values(
        "id", "received", "username", "resource", "namespace", "name", "object_uid",
        "body_chunk", "body_index"))
    for create in creates:
        create["previous_id"] = pairs[create["id"]]
    deletes = {d["id"]: d for d in events.filter(
        pk__in=[c["previous_id"] for c in creates]).values(*_DELETE_FIELDS)}
    # UIDs from the bodies of the re-creations shown first (reading a body decompresses its
    # chunk: a few hundred, not thousands); the others keep the objectRef's UID
    shown = [c for _, items in ranked_objects(creates)[:MAX_GROUPS] for c in items[-UID_PAIRS:]]
    bodies = read_bodies([*shown, *(deletes[c["previous_id"]] for c in shown
                                    if c["previous_id"] in deletes)])
    for create in creates:
        create["uid"] = create["object_uid"] or metadata_of(
            bodies.get(create["id"]), "responseObject").get("uid", "")
    for delete in deletes.values():
        body = bodies.get(delete["id"]) or {}
        response = body.get("responseObject")
        request = body.get("requestObject")
        response = response if isinstance(response, dict) else {}
        request = request if isinstance(request, dict) else {}
        delete["uid"] = (delete["object_uid"] or metadata_of(body, "responseObject").get("uid")
                         or (response.get("details") or {}).get("uid")
                         or (request.get("preconditions") or {}).get("uid") or "")
    return creates, deletes


def _recreations(events: QuerySet) -> list[tuple]:
    """(received, id, the delete's id) of each successful create of a named object whose
    previous successful create or delete of it was a delete, in time order: a window pass."""
    key_namespace = Case(When(resource="namespaces", then=Value("")), default=F("namespace"),
                         output_field=TextField())
    keys = [F("resource"), key_namespace, F("name")]
    if connection.vendor == "postgresql":
        # byte order: only equal keys matter here, and sorting 500,000 names by the database's
        # locale took 2.5 times as long
        keys = [Collate(key, "C") for key in keys]
    partition = {"partition_by": keys, "order_by": [F("received").asc(), F("id").asc()]}
    lifecycle = requests_of(events).filter(STATUS_OK, verb__in=("create", "delete")).exclude(
        name="").annotate(
        previous_verb=Window(Lag("verb"), **partition),
        previous_id=Window(Lag("id"), **partition),
        # the row's own verb as a window value: a filter on it is applied after the window
        # (Django keeps a plain ``verb`` filter inside, where it would hide the deletes)
        own_verb=Window(FirstValue("verb"), frame=RowRange(start=0, end=0), **partition))
    # ids only, unordered (an ORDER BY would sort every row before the filter): the few that
    # qualify are ordered here and their details come by primary key
    return sorted(lifecycle.filter(own_verb="create", previous_verb="delete").order_by()
                  .values_list("received", "id", "previous_id"))


def ranked_objects(creates: list[dict]) -> list[tuple[tuple[str, str, str], list[dict]]]:
    """The re-creations by object (resource, namespace, name), the most re-created first."""
    objects: dict[tuple, list[dict]] = defaultdict(list)
    for create in creates:
        namespace = "" if create["resource"] == "namespaces" else create["namespace"]
        objects[(create["resource"], namespace, create["name"])].append(create)
    return sorted(objects.items(), key=lambda kv: (-len(kv[1]), kv[1][0]["received"]))


def recreated_insights(creates: list[dict], deletes: dict[int, dict]) -> list[dict]:
    found = []
    for (resource, namespace, name), items in ranked_objects(creates)[:MAX_GROUPS]:
        pairs = [(deletes.get(c["previous_id"]), c) for c in items]
        last_delete, last_create = pairs[-1]
        others = any(d is not None and d["username"] != c["username"] for d, c in pairs)
        gap = "" if last_delete is None else format_duration(
            (last_create["received"] - last_delete["received"]) / timedelta(milliseconds=1))
        new_uid = last_create["uid"]
        old_uid = last_delete.get("uid", "") if last_delete else ""
        uid = ""
        if new_uid and old_uid and new_uid != old_uid:
            uid = f"; new UID {new_uid} (was {old_uid})"
        elif new_uid:
            uid = f"; UID {new_uid}"
        who = last_create["username"] or "(unknown user)"
        deleter = (last_delete["username"] or "(unknown user)") if last_delete else "?"
        found.append(insight(
            "recreated-object",
            f"{object_label(resource, namespace, name)} re-created by {who}"
            + (f" ({len(items)} times)" if len(items) > 1 else ""),
            "warning" if others else "info",
            f"deleted by {deleter}, created again {gap} later at "
            f"{format_time(last_create['received'])}{uid}",
            [e["id"] for d, c in pairs for e in (d, c) if e is not None],
            resource=resource, namespace=namespace, name=name,
            recreations=[{"deleted": None if d is None else {
                "event": d["id"], "at": rfc3339(d["received"]), "user": d["username"],
                "uid": d.get("uid", "")},
                "created": {"event": c["id"], "at": rfc3339(c["received"]),
                            "user": c["username"], "uid": c["uid"]}}
                for d, c in pairs[-MAX_LISTED:]]))
    return found
