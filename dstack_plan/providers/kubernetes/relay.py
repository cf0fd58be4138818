"""A service replica's port on this machine's 127.0.0.1, through the API server.

Watch's proxy sends plain HTTP to a local port, as it does to any replica. Kubernetes offers
no TCP forward to a Service over plain HTTPS (a pod's port-forward needs SPDY or WebSocket
streams per connection), but the API server proxies HTTP to any Service it has:
`/api/v1/namespaces/<ns>/services/<name>:<port>/proxy/<path>`. The relay listens here and
sends each request there with the kubeconfig's credentials, and the answer back. Each
answer is read whole before it is relayed: a streamed response arrives at its end.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from dstack_plan.providers.kubernetes.api import REQUEST_TIMEOUT, KubeAPI
from dstack_plan.providers.ssh.forward import LISTEN_ADDRESS, Forward

_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "te",
        "trailer",
        "proxy-authorization",
        "authorization",
    }
)


class RelayListener:
    """The relay's server, closed as a Forward closes its listener."""

    def __init__(self, runner: web.AppRunner):
        self._runner = runner

    def close(self) -> None:
        """Nothing to do at once: `wait_closed` stops the server."""

    async def wait_closed(self) -> None:
        await self._runner.cleanup()


async def open_relay(api: KubeAPI, service: str, port: int, local_port: int = 0) -> Forward:
    """Listen on 127.0.0.1:`local_port` (0: any free port) and relay each HTTP request to
    Service `service`'s `port`."""
    base = f"/api/v1/namespaces/{api.namespace}/services/{service}:{port}/proxy"

    async def relay(request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        path = base + request.rel_url.raw_path_qs
        status, answer_headers, data = await asyncio.to_thread(
            _send, api, request.method, path, headers, body
        )
        kept = {k: v for k, v in answer_headers.items() if k.lower() not in _HOP}
        return web.Response(status=status, body=data, headers=kept)

    app = web.Application(client_max_size=1 << 30)
    app.router.add_route("*", "/{tail:.*}", relay)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, LISTEN_ADDRESS, local_port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    bound = int(runner.addresses[0][1])
    return Forward(
        host=service, remote_port=port, local_port=bound, listener=RelayListener(runner)
    )


def _send(
    api: KubeAPI, method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, str], bytes]:
    """One request through the API server's proxy, with the client's credentials and TLS."""
    client: Any = api.client
    sent = dict(headers)
    client.update_params_for_auth(sent, [], ["BearerToken"], path, method, None)
    answer = client.rest_client.pool_manager.request(
        method,
        client.configuration.host + path,
        body=body or None,
        headers=sent,
        preload_content=True,
        redirect=False,
        retries=False,
        timeout=REQUEST_TIMEOUT,
    )
    return answer.status, dict(answer.headers), answer.data
