"""The cluster's API server through the official client, from the backend's kubeconfig.

The client is synchronous: each call runs in a worker thread so the event loop (watch, the
proxy) never waits on it. An API server that does not answer, or answers 5xx, is
`KubeUnreachable` (what reads jobs concludes nothing from it); any other refusal is a
ProviderError with Kubernetes' own message.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from dstack_plan.config.kubernetes_backend import KubernetesCluster
from dstack_plan.errors import ProviderError

KUBERNETES = "kubernetes"
REQUEST_TIMEOUT = 30.0
"""Seconds one API call may take."""

T = TypeVar("T")


class KubeUnreachable(ProviderError):
    """The API server did not answer (or answered 5xx)."""


class KubeAPI:
    """The typed API groups of one cluster, built on first use."""

    def __init__(self, cluster: KubernetesCluster):
        self.cluster = cluster
        self.namespace = cluster.namespace
        self._client: Any | None = None

    @property
    def client(self) -> Any:
        """The `ApiClient` of the cluster's kubeconfig context (loaded on first use)."""
        if self._client is None:
            path = os.path.expanduser(self.cluster.kubeconfig)
            configuration = k8s.Configuration()
            try:
                kube_config.load_kube_config(
                    config_file=path,
                    context=self.cluster.context,
                    client_configuration=configuration,
                )
            except (kube_config.ConfigException, OSError, ValueError) as e:
                raise ProviderError(
                    KUBERNETES, f"cluster {self.cluster.name}: kubeconfig {path}: {e}"
                ) from e
            configuration.retries = 1  # an API server that is down is said at once
            self._client = k8s.ApiClient(configuration)
        return self._client

    @property
    def core(self) -> Any:
        return k8s.CoreV1Api(self.client)

    @property
    def batch(self) -> Any:
        return k8s.BatchV1Api(self.client)

    @property
    def apps(self) -> Any:
        return k8s.AppsV1Api(self.client)

    async def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` in a worker thread; `what` names it in errors."""
        kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except ApiException as e:
            raise self.error(what, e) from e
        except (HTTPError, OSError) as e:
            raise KubeUnreachable(KUBERNETES, f"cluster {self.cluster.name}: {what}: {e}") from e

    async def absent_ok(
        self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> None:
        """A call (a delete) for which a 404 is success: the object is gone either way."""
        try:
            await self.call(what, fn, *args, **kwargs)
        except ProviderError as e:
            if not isinstance(e.__cause__, ApiException) or e.__cause__.status != 404:
                raise

    def error(self, what: str, e: ApiException) -> ProviderError:
        """Kubernetes' refusal, in its own words."""
        message = e.reason or "refused"
        try:
            said = json.loads(e.body or "{}")
            message = said.get("message") or message
        except (ValueError, AttributeError):
            pass
        kind = KubeUnreachable if (e.status or 0) >= 500 or not e.status else ProviderError
        return kind(KUBERNETES, f"cluster {self.cluster.name}: {what}: {message} ({e.status})")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
