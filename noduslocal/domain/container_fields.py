"""What a job's `image` and `network` may be: a docker image reference, and the network a
container gets (docker's bridge, or none); host jobs share the host's network.
"""

from __future__ import annotations

import re
from typing import Any

from noduslocal.domain.errors import InvalidArgument, Unsupported

# Docker's reference grammar, loosely: [registry[:port]/]path[:tag][@digest].
IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$")


def container_image(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not IMAGE_RE.fullmatch(value) or "//" in value:
        raise InvalidArgument(f"image: {value!r} is not an image reference, e.g. "
                              "\"python:3.11\" or \"ghcr.io/org/train:v2\"", field="image")
    return value


def registry_of(image: str) -> str | None:
    """The registry an image reference names (HOST or HOST:PORT, lower case), as docker
    reads it: a first component with a dot, a colon or a capital, or `localhost`. None
    for Docker Hub's images ("python:3.11", "org/train:v2")."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"
                  or first != first.lower()):
        return first.lower()
    return None


NETWORKS = ("none", "bridge")


def container_network(value: Any, container: bool) -> str | None:
    """None (docker's default bridge for containers), "bridge", or "none". Host jobs share
    the host's network, so only the default means something for them."""
    if value is None:
        return None
    if value not in NETWORKS:
        raise InvalidArgument(f"network: {value!r} is not allowed; use one of "
                              f"{', '.join(NETWORKS)} (host networking is never given)",
                              field="network")
    if not container:
        raise Unsupported("network", "a host job shares the host's network; isolating it "
                          "needs an image")
    return value
