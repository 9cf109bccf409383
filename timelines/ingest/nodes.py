"""One name per node across an incident's evidence.

A node's journal and its host service logs name it by its host name (``ip-10-0-187-218``), the
cluster by its Node object's name, which on most clouds is the fully qualified one
(``ip-10-0-187-218.ec2.internal``: the pods' ``spec.nodeName``, the kubelet's Events, the
state of the Node). Stored as they come, one node is two values of the ``node`` filter, and
a click on one leaves the other's lines out (the fixtures' must-gather: 22,035 journal lines and
Events under the short names of three nodes whose other Events and state are under the long
ones; the sonobuoy run: 2,374 under three).

``unify_node_names``, once every file of the incident is stored (``prepare_reads``), gives each
short name the long one whose first label it is, when exactly one long name of the incident has
that first label; a short name that matches none (``localhost``, a node that no other evidence
names) or several (two clusters' nodes) is left as it is. The rows keep their stored bodies
(the evidence as it was); their uploads get a new ``finished_at``, a new data version
(``aggregate.data_version``), so that nothing counted under the old names is used again.
Running it again changes nothing.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from incidents.models import Upload

from ..models import Event

log = logging.getLogger(__name__)

# The formats whose rows name nodes (audit logs name none: their incidents are not read at all)
NODE_FORMATS = ("klog", "text-log", "k8s-events", "k8s-objects", "gke-log")


def aliases(names) -> dict[str, str]:
    """Short name → the one long name (with a dot) whose first label it is, among ``names``."""
    longs: dict[str, list[str]] = {}
    for name in names:
        if "." in name:
            longs.setdefault(name.split(".", 1)[0], []).append(name)
    return {name: longs[name][0] for name in names
            if name and "." not in name and len(longs.get(name, ())) == 1}


def unify_node_names(incident_id: int) -> int:
    """Rename the incident's short node names to their long ones (module docstring); returns
    the rows renamed."""
    if not Upload.objects.filter(incident_id=incident_id, format__in=NODE_FORMATS).exists():
        return 0
    events = Event.objects.filter(incident_id=incident_id)
    names = events.exclude(node="").order_by().values_list("node", flat=True).distinct()
    renames = aliases(list(names))
    if not renames:
        return 0
    renamed = 0
    with transaction.atomic():
        uploads = set()
        for short, full in sorted(renames.items()):
            rows = events.filter(node=short)
            uploads |= set(rows.order_by().values_list("upload_id", flat=True).distinct())
            renamed += rows.update(node=full)
        # a new data version: what was counted or indexed under the old names is not used again
        Upload.objects.filter(pk__in=[u for u in uploads if u is not None]).exclude(
            finished_at=None).update(finished_at=timezone.now())
    log.info("incident %s: %d rows of %d nodes named as the cluster names them (%s)",
             incident_id, renamed, len(renames),
             ", ".join(f"{s} → {f}" for s, f in sorted(renames.items())[:5]))
    return renamed
