"""Gateways: the relay on a fleet host that serves services at `https://<run>.<domain>/`.

- `handler`: `GatewayHandler`, `GatewayRecord`, `service_gateway`
"""
