"""Gateways: the relay on a fleet host that serves services at `https://<run>.<domain>/`.

- `handler`: `GatewayHandler`, `GatewayRecord`
- `served`: which gateway (this project's or an exported one) serves a service, its host
  name there, where this project's tunnel ends (`served_by`, `ServedBy`)
"""
