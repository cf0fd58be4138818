"""Docker image references, checked against the distribution/reference grammar."""

from __future__ import annotations

import re

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_NAME = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*"
_IPV6 = r"\[[a-fA-F0-9:]+\]"
_DOMAIN = rf"(?:{_DOMAIN_NAME}|{_IPV6})(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"

_REFERENCE = re.compile(
    rf"(?P<name>(?:(?P<domain>{_DOMAIN})/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?"
)
_NAME_MAX = 255


def image_reference_error(reference: str) -> str | None:
    """Why `reference` is not a valid image reference, or None when it is."""
    if not reference:
        return "must not be empty"
    if reference != reference.strip() or any(c.isspace() for c in reference):
        return "must not contain whitespace"
    match = _REFERENCE.fullmatch(reference)
    if match is None and _REFERENCE.fullmatch(reference.lower()):
        return "repository names must be lowercase"
    if match is None:
        bad = sorted({c for c in reference if not (c.isalnum() or c in "._-/:@[]")})
        if bad:
            shown = " ".join(repr(c) for c in bad)
            return f"contains characters not allowed in an image reference: {shown}"
        return "is not a valid image reference (expected [registry/]name[:tag][@digest])"
    domain = match.group("domain")
    first = match.group("name").split("/", 1)[0]
    # A first component without '.' or ':' (and not localhost) is a path, not a registry, and
    # paths must be lowercase; the domain-aware regex above would accept e.g. "UPPER/x".
    if domain is not None and not ("." in first or ":" in first or first == "localhost"):
        if first != first.lower():
            return "repository names must be lowercase"
    if len(match.group("name")) > _NAME_MAX:
        return f"repository name is longer than {_NAME_MAX} characters"
    return None
