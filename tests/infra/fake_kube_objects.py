"""Operations on the fake Kubernetes API's objects (tests/infra/fake_kube.py): conditions,
owner references, label and field selectors, and the three patch formats (JSON merge,
strategic merge, JSON patch).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from tests.infra.fake_kube_store import KubeError, Obj, bad_request, now_rfc3339


def set_condition(
    conditions: list[Obj], kind: str, status: str, reason: str = "", message: str = ""
) -> bool:
    """Set condition `kind` in a status's list (its lastTransitionTime changes only when its
    status does); whether anything changed."""
    current = next((c for c in conditions if c["type"] == kind), None)
    wanted: Obj = {"type": kind, "status": status}
    if reason:
        wanted["reason"] = reason
    if message:
        wanted["message"] = message
    if current is None:
        conditions.append(wanted | {"lastTransitionTime": now_rfc3339()})
        return True
    times = ("lastTransitionTime", "lastProbeTime", "lastHeartbeatTime", "lastUpdateTime")
    if {k: v for k, v in current.items() if k not in times} == wanted:
        return False
    moved = current["status"] != status
    since = now_rfc3339() if moved else current.get("lastTransitionTime", now_rfc3339())
    current.clear()
    current.update(wanted | {"lastTransitionTime": since})
    return True


TERMINAL = ("Succeeded", "Failed")


def owned_by(obj: Obj, uid: str) -> bool:
    """Whether `obj` has an owner reference to `uid`."""
    return any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or [])


def condition_true(status: Obj, kind: str) -> Obj | None:
    """The condition `kind` of `status` when its status is "True"."""
    return next(
        (c for c in status.get("conditions") or [] if c["type"] == kind and c["status"] == "True"),
        None,
    )


def pod_ready(pod: Obj) -> bool:
    """Whether the pod's Ready condition is True."""
    return condition_true(pod["status"], "Ready") is not None


def live(pod: Obj) -> bool:
    """Whether the pod counts: neither terminated nor being deleted."""
    return pod["status"].get("phase") not in TERMINAL and not pod["metadata"].get(
        "deletionTimestamp"
    )


def owner_ref(owner: Obj) -> Obj:
    """A controller's owner reference to `owner`."""
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


# -- selectors


def _split_outside_parens(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse_label_selector(text: str) -> list[tuple[str, str, list[str]]]:
    """`a=b,c!=d,e,!f,g in (x,y),h notin (z)` as (key, operator, values) requirements,
    operators `=`, `!=`, `in`, `notin`, `exists`, `!exists`; 400 when malformed."""
    requirements = []
    for part in _split_outside_parens(text):
        if m := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)", part):
            values = [v.strip() for v in m.group(3).split(",") if v.strip()]
            requirements.append((m.group(1), m.group(2), values))
        elif m := re.fullmatch(r"([\w./-]+)\s*(!=|==|=)\s*([\w.-]*)", part):
            op = "!=" if m.group(2) == "!=" else "="
            requirements.append((m.group(1), op, [m.group(3)]))
        elif m := re.fullmatch(r"(!?)\s*([\w./-]+)", part):
            requirements.append((m.group(2), "!exists" if m.group(1) else "exists", []))
        else:
            raise bad_request(f"unable to parse requirement: {part!r}")
    return requirements


def labels_match(labels: dict[str, str], requirements: list[tuple[str, str, list[str]]]) -> bool:
    """Whether `labels` meet every requirement of `parse_label_selector`."""
    for key, op, values in requirements:
        present, value = key in labels, labels.get(key)
        if op == "=":
            ok = present and value == values[0]
        elif op == "!=":
            ok = value != values[0]
        elif op == "in":
            ok = present and value in values
        elif op == "notin":
            ok = value not in values
        else:
            ok = present == (op == "exists")
        if not ok:
            return False
    return True


def selector_matches(selector: Obj | None, labels: dict[str, str]) -> bool:
    """Whether a `LabelSelector` object selects `labels` (a null selector selects nothing,
    an empty one everything)."""
    if selector is None:
        return False
    requirements = [(k, "=", [v]) for k, v in (selector.get("matchLabels") or {}).items()]
    names = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expr in selector.get("matchExpressions") or []:
        requirements.append((expr["key"], names[expr["operator"]], expr.get("values") or []))
    return labels_match(labels, requirements)


def selector_string(selector: Obj) -> str:
    """A `LabelSelector`'s matchLabels as the string form (Scale.status.selector)."""
    return ",".join(f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items()))


def field_value(obj: Obj, dotted: str) -> str:
    """The value at a dotted path (`status.phase`) as a field selector compares it."""
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def fields_match(obj: Obj, text: str) -> bool:
    """Whether `obj` meets a field selector such as `metadata.name=x,status.phase!=Failed`."""
    for part in _split_outside_parens(text):
        m = re.fullmatch(r"([\w.]+)\s*(!=|==|=)\s*(.*)", part)
        if m is None:
            raise bad_request(f"invalid field selector: {part!r}")
        equal = field_value(obj, m.group(1)) == m.group(3)
        if equal == (m.group(2) == "!="):
            return False
    return True


# -- patches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge, `null` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# The fields the API's strategic merge patch merges lists by (patchMergeKey in the Go types):
# a list of objects that all carry one of these merges item by item, any other list replaces.
_MERGE_KEYS = ("name", "containerPort", "port", "mountPath", "devicePath", "type", "uid", "ip")


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch, simplified: as `merge_patch`, except lists of objects that
    carry a merge key (`name`, `containerPort`, ...) merge by it (`$patch: delete` in an item
    removes it), and `$patch: replace` in an object replaces it."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue  # $setElementOrder and the like only order items
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_lists(result[key], value)
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _merge_lists(old: list[Any], new: list[Any]) -> list[Any]:
    items = old + new
    if not new or not all(isinstance(i, dict) for i in items):
        return copy.deepcopy(new)
    key = next((k for k in _MERGE_KEYS if all(k in i for i in items)), None)
    if key is None:
        return copy.deepcopy(new)
    result = copy.deepcopy(old)
    for item in new:
        at = next((n for n, o in enumerate(result) if o.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                del result[at]
        elif at is None:
            result.append({k: v for k, v in copy.deepcopy(item).items() if k != "$patch"})
        else:
            result[at] = strategic_merge_patch(result[at], item)
    return result


def json_patch(doc: Any, operations: list[Any]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test); 422 when an operation
    does not apply."""
    doc = copy.deepcopy(doc)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid JSON patch operation: {op!r}")
        kind, path = op["op"], _pointer(op["path"])
        if kind in ("move", "copy"):
            value = copy.deepcopy(_get_pointer(doc, _pointer(op.get("from", ""))))
            if kind == "move":
                doc = _remove_pointer(doc, _pointer(op["from"]))
            doc = _add_pointer(doc, path, value)
        elif kind == "add":
            doc = _add_pointer(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove_pointer(doc, path)
        elif kind == "replace":
            _get_pointer(doc, path)  # must exist
            doc = _add_pointer(_remove_pointer(doc, path), path, copy.deepcopy(op.get("value")))
        elif kind == "test":
            if _get_pointer(doc, path) != op.get("value"):
                raise KubeError(422, "Invalid", f"testing value {op['path']} failed")
        else:
            raise bad_request(f"unknown JSON patch operation {kind!r}")
    return doc


def _pointer(text: str) -> list[str]:
    if text == "":
        return []
    if not text.startswith("/"):
        raise bad_request(f"invalid JSON pointer {text!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in text[1:].split("/")]


def _missing(tokens: list[str]) -> KubeError:
    return KubeError(422, "Invalid", f"JSON patch path /{'/'.join(tokens)} does not exist")


def _step(container: Any, token: str, tokens: list[str]) -> Any:
    if isinstance(container, dict) and token in container:
        return container[token]
    if isinstance(container, list) and token.isdigit() and int(token) < len(container):
        return container[int(token)]
    raise _missing(tokens)


def _get_pointer(doc: Any, tokens: list[str]) -> Any:
    for token in tokens:
        doc = _step(doc, token, tokens)
    return doc


def _add_pointer(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _get_pointer(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list) and (last == "-" or last.isdigit()):
        at = len(parent) if last == "-" else int(last)
        if at > len(parent):
            raise _missing(tokens)
        parent.insert(at, value)
    else:
        raise _missing(tokens)
    return doc


def _remove_pointer(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        return None
    parent = _get_pointer(doc, tokens[:-1])
    _step(parent, tokens[-1], tokens)  # must exist
    if isinstance(parent, dict):
        del parent[tokens[-1]]
    else:
        del parent[int(tokens[-1])]
    return doc
