"""The fields of Falco's ``k8s_audit`` source (the k8saudit plugin's ``ka.*`` and the json
plugin's ``jevt.*``), extracted from one audit event (a dict, one stage of a request).

An extractor answers ``None`` when the event does not hold the field (Falco: the extraction
fails, so every comparison on it is false and ``exists`` is false), a ``str`` for a single
value, or a ``list`` of ``str`` for the plugin's list fields (``ka.user.groups``,
``ka.req.pod.containers.image``…). Values are rendered as Falco renders them: booleans
``true``/``false``, numbers in decimal, objects and arrays as compact JSON.

No Django import here: the engine runs on plain dicts (the tests feed it Falco's trace files).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from fnmatch import fnmatchcase
from urllib.parse import parse_qs, urlsplit

import orjson

Value = str | list[str] | None
Extractor = Callable[[dict], Value]

# fields whose value is a list (``in`` means "every value is in the set", ``intersects`` "one")
LIST_FIELDS: set[str] = set()
# fields that take an argument in brackets: name -> whether the argument is required
ARG_FIELDS: dict[str, bool] = {}


def render(value) -> str | None:
    if value is None:
        return None
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(int(value)) if float(value).is_integer() else str(value)
    return orjson.dumps(value).decode()


def dig(event: dict, *path):
    node = event
    for key in path:
        if isinstance(node, dict):
            node = node.get(key)
        elif isinstance(node, list) and isinstance(key, int) and -len(node) <= key < len(node):
            node = node[key]
        else:
            return None
        if node is None:
            return None
    return node


def json_pointer(event: dict, pointer: str):
    """RFC 6901: ``/a~1b/0`` (``~1`` is ``/``, ``~0`` is ``~``); None when absent."""
    if pointer == "":
        return event
    if not pointer.startswith("/"):
        return None
    return follow(event, pointer_keys(pointer))


def pointer_keys(pointer: str) -> list[str]:
    """The keys of a JSON pointer that starts with ``/``, unescaped."""
    return [raw.replace("~1", "/").replace("~0", "~") for raw in pointer[1:].split("/")]


def follow(event: dict, keys: list[str]):
    node = event
    for key in keys:
        if isinstance(node, dict):
            if key not in node:
                return None
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


def repository(image: str) -> str:
    """``docker.io/library/nginx:1.25@sha256:…`` → ``docker.io/library/nginx``."""
    image = image.split("@", 1)[0]
    slash = image.rfind("/")
    colon = image.rfind(":")
    return image[:colon] if colon > slash else image


def _rfc3339_ns(text) -> int | None:
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


def _time(event: dict):
    return event.get("stageTimestamp") or event.get("timestamp") or dig(
        event, "metadata", "creationTimestamp")


FIELDS: dict[str, Extractor] = {}


def field(name: str, *, is_list: bool = False):
    def register(function):
        FIELDS[name] = function
        if is_list:
            LIST_FIELDS.add(name)
        return function
    return register


def simple(name: str, *path, is_list: bool = False):
    if is_list:
        def extract(event):
            value = dig(event, *path)
            if not isinstance(value, list):
                return None
            return [render(v) for v in value if v is not None]
    else:
        # the body's few hundred thousand reads of ``verb``, ``objectRef.resource``…: one
        # dict lookup a key and a string returned as it is, rather than ``dig`` and ``render``
        def extract(event):
            node = event
            for key in path:
                if not isinstance(node, dict):
                    return None
                node = node.get(key)
            if node.__class__ is str:
                return node
            return None if isinstance(node, dict | list) and not node else render(node)
    field(name, is_list=is_list)(extract)


# --- jevt.* -------------------------------------------------------------------------------------

@field("jevt.rawtime")
def _rawtime(event):
    ns = _rfc3339_ns(_time(event))
    return None if ns is None else str(ns)


@field("jevt.time")
def _jtime(event):
    value = _time(event)
    return value if isinstance(value, str) else None


@field("jevt.obj")
def _obj(event):
    return orjson.dumps(event).decode()


def _jevt_value(event, pointer):
    return render(json_pointer(event, pointer))


FIELDS["jevt.value"] = _jevt_value
ARG_FIELDS["jevt.value"] = True

# --- ka.*: the request ----------------------------------------------------------------------

simple("ka.auditid", "auditID")
simple("ka.stage", "stage")
simple("ka.verb", "verb")
simple("ka.uri", "requestURI")
simple("ka.useragent", "userAgent")
simple("ka.sourceips", "sourceIPs", is_list=True)
simple("ka.user.name", "user", "username")
simple("ka.user.groups", "user", "groups", is_list=True)
simple("ka.impuser.name", "impersonatedUser", "username")
simple("ka.target.name", "objectRef", "name")
simple("ka.target.namespace", "objectRef", "namespace")
simple("ka.target.resource", "objectRef", "resource")
simple("ka.target.subresource", "objectRef", "subresource")
simple("ka.auth.decision", "annotations", "authorization.k8s.io/decision")
simple("ka.auth.reason", "annotations", "authorization.k8s.io/reason")
simple("ka.resp.name", "responseObject", "metadata", "name")
simple("ka.response.code", "responseStatus", "code")
simple("ka.response.reason", "responseStatus", "reason")


def _uri_param(event, name):
    uri = event.get("requestURI")
    if not isinstance(uri, str):
        return None
    values = parse_qs(urlsplit(uri).query, keep_blank_values=True).get(name)
    return values[0] if values else None


FIELDS["ka.uri.param"] = _uri_param
ARG_FIELDS["ka.uri.param"] = True

# --- ka.req.*: the request object -----------------------------------------------------------

simple("ka.req.binding.role", "requestObject", "roleRef", "name")
simple("ka.req.configmap.name", "objectRef", "name")
simple("ka.req.service.type", "requestObject", "spec", "type")
simple("ka.req.service.ports", "requestObject", "spec", "ports")
simple("ka.req.role.rules", "requestObject", "rules")
simple("ka.req.pod.host_network", "requestObject", "spec", "hostNetwork")
simple("ka.req.pod.host_pid", "requestObject", "spec", "hostPID")
simple("ka.req.pod.host_ipc", "requestObject", "spec", "hostIPC")
simple("ka.req.pod.run_as_user", "requestObject", "spec", "securityContext", "runAsUser")
simple("ka.req.pod.run_as_group", "requestObject", "spec", "securityContext", "runAsGroup")
simple("ka.req.pod.fs_group", "requestObject", "spec", "securityContext", "fsGroup")
simple("ka.req.pod.supplemental_groups", "requestObject", "spec", "securityContext",
       "supplementalGroups", is_list=True)
simple("ka.req.container.host_network", "requestObject", "spec", "hostNetwork")


@field("ka.req.configmap.obj")
def _configmap_obj(event):
    data = dig(event, "requestObject", "data")
    return None if data is None else render(data)


@field("ka.req.binding.subjects", is_list=True)
def _subjects(event):
    subjects = dig(event, "requestObject", "subjects")
    if not isinstance(subjects, list):
        return None
    return [render(s.get("name")) for s in subjects if isinstance(s, dict) and s.get("name")]


def _has_name(event, name):
    subjects = dig(event, "requestObject", "subjects")
    if not isinstance(subjects, list):
        return None
    return render(any(isinstance(s, dict) and s.get("name") == name for s in subjects))


FIELDS["ka.req.binding.subject.has_name"] = _has_name
ARG_FIELDS["ka.req.binding.subject.has_name"] = True


def _role_rules(key):
    def extract(event):
        rules = dig(event, "requestObject", "rules")
        if not isinstance(rules, list):
            return None
        return [render(v) for rule in rules if isinstance(rule, dict)
                for v in (rule.get(key) or []) if v is not None]
    return extract


for _key, _name in (("apiGroups", "apiGroups"), ("nonResourceURLs", "nonResourceURLs"),
                    ("verbs", "verbs"), ("resources", "resources"),
                    ("resourceNames", "resourceNames")):
    field(f"ka.req.role.rules.{_name}", is_list=True)(_role_rules(_key))


def _containers(event, kind):
    containers = dig(event, "requestObject", "spec", kind)
    return [c for c in containers if isinstance(c, dict)] if isinstance(containers, list) \
        else None


def _per_container(kind: str, get: Callable[[dict], object], default=None):
    def extract(event):
        containers = _containers(event, kind)
        if containers is None:
            return None
        out = []
        for container in containers:
            value = get(container)
            if value is None:
                value = default
            if value is not None:
                out.append(render(value))
        return out
    return extract


_CONTAINER_FIELDS: dict[str, tuple[Callable[[dict], object], object]] = {
    "image": (lambda c: c.get("image"), None),
    "image.repository": (lambda c: repository(c["image"]) if isinstance(c.get("image"), str)
                         else None, None),
    "privileged": (lambda c: dig(c, "securityContext", "privileged"), False),
    "allow_privilege_escalation": (
        lambda c: dig(c, "securityContext", "allowPrivilegeEscalation"), None),
    "read_only_fs": (lambda c: dig(c, "securityContext", "readOnlyRootFilesystem"), None),
    "run_as_user": (lambda c: dig(c, "securityContext", "runAsUser"), None),
    "run_as_group": (lambda c: dig(c, "securityContext", "runAsGroup"), None),
    "proc_mount": (lambda c: dig(c, "securityContext", "procMount"), None),
}

for _kind in ("containers", "initContainers", "ephemeralContainers"):
    for _suffix, (_get, _default) in _CONTAINER_FIELDS.items():
        field(f"ka.req.pod.{_kind}.{_suffix}", is_list=True)(
            _per_container(_kind, _get, _default))
    field(f"ka.req.pod.{_kind}.host_port", is_list=True)(
        lambda event, kind=_kind: None if _containers(event, kind) is None else [
            render(p["hostPort"]) for c in _containers(event, kind)
            for p in (c.get("ports") or []) if isinstance(p, dict) and "hostPort" in p])
    field(f"ka.req.pod.{_kind}.add_capabilities", is_list=True)(
        lambda event, kind=_kind: None if _containers(event, kind) is None else [
            render(cap) for c in _containers(event, kind)
            for cap in (dig(c, "securityContext", "capabilities", "add") or [])])


@field("ka.req.pod.volumes.hostpath", is_list=True)
def _hostpaths(event):
    volumes = dig(event, "requestObject", "spec", "volumes")
    if not isinstance(volumes, list):
        return None
    return [v["hostPath"]["path"] for v in volumes if isinstance(v, dict)
            and isinstance(v.get("hostPath"), dict) and isinstance(v["hostPath"].get("path"), str)]


@field("ka.req.pod.volumes.volume_type", is_list=True)
def _volume_types(event):
    volumes = dig(event, "requestObject", "spec", "volumes")
    if not isinstance(volumes, list):
        return None
    return [k for v in volumes if isinstance(v, dict) for k in v if k != "name"]


@field("ka.req.pod.volumes.flexvolume_driver", is_list=True)
def _flex(event):
    volumes = dig(event, "requestObject", "spec", "volumes")
    if not isinstance(volumes, list):
        return None
    return [v["flexVolume"]["driver"] for v in volumes if isinstance(v, dict)
            and isinstance(v.get("flexVolume"), dict) and "driver" in v["flexVolume"]]


# the deprecated single-container fields of engine version 4 and older rules
@field("ka.req.container.image")
def _first_image(event):
    images = FIELDS["ka.req.pod.containers.image"](event)
    return images[0] if images else None


@field("ka.req.container.image.repository")
def _first_repository(event):
    images = FIELDS["ka.req.pod.containers.image.repository"](event)
    return images[0] if images else None


@field("ka.req.container.privileged")
def _any_privileged(event):
    values = FIELDS["ka.req.pod.containers.privileged"](event)
    return None if values is None else render("true" in values)


def _volume_hostpath(event, pattern):
    paths = _hostpaths(event)
    if paths is None:
        return None
    return render(any(fnmatchcase(path, pattern) for path in paths))


FIELDS["ka.req.volume.hostpath"] = _volume_hostpath
ARG_FIELDS["ka.req.volume.hostpath"] = True

FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)+(?:\[[^\]]*\])?")


def split_field(text: str) -> tuple[str, str | None]:
    """``jevt.value[/stage]`` → (``jevt.value``, ``/stage``); ``ka.verb`` → (``ka.verb``,
    None)."""
    if text.endswith("]") and "[" in text:
        name, arg = text[:-1].split("[", 1)
        return name, arg
    return text, None


def extractor(text: str) -> Extractor | None:
    """The extractor of a field as written in a rule (with its argument), None if unknown."""
    name, arg = split_field(text)
    function = FIELDS.get(name)
    if function is None:
        return None
    if name in ARG_FIELDS:
        if arg is None:
            return None
        if name == "jevt.value" and arg.startswith("/"):
            keys = pointer_keys(arg)  # split once, not at every event
            return lambda event: render(follow(event, keys))
        return lambda event: function(event, arg)
    if arg is not None:
        # a list field may be indexed: ka.req.pod.containers.image[0]
        if name in LIST_FIELDS and arg.isdigit():
            index = int(arg)

            def indexed(event):
                values = function(event)
                return values[index] if values and index < len(values) else None
            return indexed
        return None
    return function


def is_list_field(text: str) -> bool:
    name, arg = split_field(text)
    return name in LIST_FIELDS and arg is None
