"""The API server's messages about a child, rewritten to name the InferenceService's fields.

The API server judges the Deployment manifests.py builds, so its messages name the
Deployment's fields (`spec.template.spec.containers[0].env[4]`) and, for some rules of
built-in types, print the offending value as a Go struct (`core.Toleration{Key:"a", ...}`, with
pointer fields as addresses that change on every call). Where manifests.py copies a spec field
into the Deployment the path is mapped back (`spec.env[0]`) and a struct is replaced by the
spec's value in JSON; other paths stay as they are, and no pointer address survives.

Pure functions: the message in, the message out.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .manifests import user_env_offset, user_volume_offsets
from .spec import InferenceServiceSpec

POD = "spec.template.spec."
CONTAINER = POD + "containers[0]."
# Deployment path -> the spec's field, for what manifests.py copies as it is (longest first).
COPIED = sorted([
    (POD + "tolerations", "spec.tolerations"),
    (POD + "affinity", "spec.affinity"),
    (POD + "nodeSelector", "spec.nodeSelector"),
    (POD + "securityContext", "spec.podSecurityContext"),
    (POD + "serviceAccountName", "spec.serviceAccountName"),
    (POD + "imagePullSecrets", "spec.imagePullSecrets"),
    (POD + "priorityClassName", "spec.priorityClassName"),
    (POD + "runtimeClassName", "spec.runtimeClassName"),
    (POD + "topologySpreadConstraints", "spec.topologySpreadConstraints"),
    (CONTAINER + "securityContext", "spec.containerSecurityContext"),
    (CONTAINER + "imagePullPolicy", "spec.imagePullPolicy"),
    (CONTAINER + "image", "spec.image"),
    ("spec.template.metadata.annotations", "spec.podAnnotations"),
    ("spec.template.metadata.labels", "spec.podLabels"),
], key=lambda pair: -len(pair[0]))
ENV = re.compile(re.escape(CONTAINER) + r"env\[(\d+)\]")
VOLUME = re.compile(re.escape(POD) + r"volumes\[(\d+)\]")
MOUNT = re.compile(re.escape(CONTAINER) + r"volumeMounts\[(\d+)\]")
RESOURCE = re.compile(re.escape(CONTAINER) + r"resources\.(?:requests|limits)"
                      r"(?:\[([^\]]+)\]|\.([\w./-]+))")
# A path of the Deployment as field.Path prints it: names, [index] and [map key].
PATH = re.compile(r"(?<![\w.\]])spec\.template(?:\.[A-Za-z_]\w*|\[[^\]\s]*\])+")
# field.Error.ErrorBody: "<path>: <type>: <value>[: <detail>]" for errors that carry a value.
VALUE_AFTER = re.compile(r": (?:Invalid value|Unsupported value|Duplicate value|Not found): ")
# The start of a Go `%#v` struct or map (`core.Toleration{`, `map[string]string{`) or a JSON
# object, which the server prints for a value of a built-in type.
DUMP = re.compile(r"(?:\[\]|map\[[^\]]*\])?[A-Za-z_][\w.]*\{|\{")
POINTER = re.compile(r"\(0x[0-9a-fA-F]+\)")
SEGMENT = re.compile(r"\.?([A-Za-z_]\w*)|\[([^\]]*)\]")


def _boundary(rest: str) -> bool:
    return rest == "" or rest[0] in ".["


def user_path(path: str, spec: InferenceServiceSpec) -> str | None:
    """The spec field a Deployment path comes from, or None where none does (or several)."""
    for ours, theirs in COPIED:
        if path.startswith(ours) and _boundary(path[len(ours):]):
            return theirs + path[len(ours):]
    volume_offset, mount_offset = user_volume_offsets(spec)
    for pattern, field, offset, count in (
            (ENV, "env", user_env_offset(spec), len(spec.env)),
            (VOLUME, "volumes", volume_offset, len(spec.volumes)),
            (MOUNT, "volumeMounts", mount_offset, len(spec.volume_mounts))):
        if match := pattern.match(path):
            index = int(match.group(1)) - offset
            rest = path[match.end():]
            return (f"spec.{field}[{index}]{rest}" if 0 <= index < count and _boundary(rest)
                    else None)
    if match := RESOURCE.match(path):
        name = match.group(1) or match.group(2)
        fields = {"cpu": "cpu", "memory": "memory", spec.resources.gpu_resource_name: "gpus"}
        return f"spec.resources.{fields[name]}" if name in fields else None
    return None


def _object_at(path: str, spec: InferenceServiceSpec) -> Any:
    """The object (dict or list) of the spec at a user path, or the nearest one holding it: a
    rule may print a whole toleration under `tolerations[0].operator`. None if there is none."""
    value: Any = {"spec": spec.model_dump(by_alias=True, exclude_none=True)}
    found = None
    for depth, (name, key) in enumerate(SEGMENT.findall(path)):
        part: Any = name or (int(key) if key.isdigit() else key)
        try:
            value = value[part]
        except (KeyError, IndexError, TypeError):
            return found
        found = value if depth and isinstance(value, dict | list) else found  # not all of spec
    return found


def _string_end(text: str, i: int) -> int:
    """The index after the quoted string that opens at text[i]."""
    i += 1
    while i < len(text) and text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _dump_end(text: str, start: int) -> int:
    """The end of the braces opened at text[start] (quoted strings skipped)."""
    depth, i = 0, start
    while i < len(text):
        char = text[i]
        if char == '"':
            i = _string_end(text, i)
            continue
        depth += {"{": 1, "}": -1}.get(char, 0)
        i += 1
        if depth == 0:
            return i
    return len(text)


def _replace_dump(text: str, value: Any) -> str:
    """`text` starts right after "Invalid value: "; a struct there becomes `value` in JSON, or
    its type name when the spec has no value for it."""
    match = DUMP.match(text)
    if not match:
        return text
    end = _dump_end(text, match.end() - 1)
    if value is not None:
        shown = json.dumps(value, sort_keys=True, separators=(",", ":"))
    else:
        shown = f"({match.group(0).rstrip('{') or 'object'})"
    return shown + text[end:]


def stable(message: str) -> str:
    """The message without Go pointer addresses, which differ on every answer."""
    return POINTER.sub("(pointer)", message)


def user_message(message: str, spec: InferenceServiceSpec) -> str:
    """The message with the Deployment's paths mapped to the spec's and values of built-in
    types shown as the spec's JSON."""
    pos = 0
    while match := PATH.search(message, pos):
        mapped = user_path(match.group(0), spec)
        shown = mapped or match.group(0)
        message = message[:match.start()] + shown + message[match.end():]
        pos = match.start() + len(shown)
        if body := VALUE_AFTER.match(message, pos):
            pos = body.end()
            value = _object_at(mapped, spec) if mapped else None
            message = message[:pos] + _replace_dump(message[pos:], value)
    return stable(message)
