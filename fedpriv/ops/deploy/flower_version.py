"""The installed Flower's version and the Fleet API transport it speaks: the one place that
decides it (``fedpriv deploy``, the compose file generator and ``docker/`` follow it).

* Flower 1.39 (the oldest supported release): SuperNodes reach the SuperLink's Fleet API over
  gRPC-rere, on a port of its own (``flower-superlink --fleet-api-address HOST:PORT``); the
  Control and Runtime APIs are served over HTTP on ``--host``/``--port``.
* Flower 1.40 and newer (up to 1.42, the newest supported): SuperNodes reach the Fleet API over
  HTTP. The SuperLink serves the Runtime, Control and Fleet HTTP APIs on one ``--host``/``--port``
  (``--fleet-api-address`` is deprecated, and the gRPC Fleet API is no longer started), and
  ``flower-supernode --superlink`` names that one address.

TLS (``--ssl-*`` on the SuperLink, ``--root-certificates`` on the SuperNodes) and SuperNode
authentication (``--enable-supernode-auth``, ``--auth-supernode-private-key``, keys registered
with ``flwr supernode register``) take the same flags on both transports.
"""

from __future__ import annotations

import importlib.metadata
import re

GRPC_RERE = "grpc-rere"  # Flower 1.39: the Fleet API on a gRPC port of its own
HTTP = "http"  # Flower >= 1.40: the Fleet API on the SuperLink's one HTTP host:port
TRANSPORTS = (GRPC_RERE, HTTP)
HTTP_FLEET_SINCE = (1, 40)  # the first Flower release whose SuperNodes speak HTTP only
SUPPORTED = ((1, 39), (1, 42))  # oldest and newest supported Flower (pyproject.toml: flwr>=1.39,<1.43)
# The Flower the Docker images are built with: docker/build-images.sh builds their wheelhouse
# with ci/constraints-newest.txt (tests/test_deploy.py checks that the two agree).
DOCKER_FLWR_VERSION = "1.42.0"


def parse_version(text: str) -> tuple[int, int, int]:
    """``"1.42.0"`` -> ``(1, 42, 0)``; pre-release and local parts are dropped (``"1.40.0rc1"``
    -> ``(1, 40, 0)``)."""
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        raise ValueError(f"not a version: {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def flwr_version() -> tuple[int, int, int]:
    """The version of the installed ``flwr`` distribution (read from its metadata, without
    importing Flower)."""
    return parse_version(importlib.metadata.version("flwr"))


def fleet_transport(version: tuple[int, ...] | str | None = None) -> str:
    """The Fleet API transport of a Flower version (default: the installed one):
    :data:`GRPC_RERE` before 1.40, :data:`HTTP` from 1.40 on."""
    if version is None:
        version = flwr_version()
    elif isinstance(version, str):
        version = parse_version(version)
    return HTTP if tuple(version[:2]) >= HTTP_FLEET_SINCE else GRPC_RERE


def docker_transport() -> str:
    """The Fleet API transport of the Flower in the Docker images (:data:`DOCKER_FLWR_VERSION`)."""
    return fleet_transport(DOCKER_FLWR_VERSION)
