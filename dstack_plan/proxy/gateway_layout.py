"""Where a gateway's files live on its host, under `~/.dstack-plan/gateways/<name>/`.

Its own module so that what only needs a path (a plan naming the socket a service's tunnel
will use) does not import the SSH client that installs the relay (`gateway_install.py`).
"""

GATEWAYS_DIR = ".dstack-plan/gateways"
RELAY_NAME = "gateway_relay.py"
SOCKET_NAME = "upstream.sock"
"""The end of the reverse tunnel the owner's watch opens (`watch/gateway_tunnels.py`)."""
ROUTES_DIR = "routes"
"""The host names claimed by the services of the projects the gateway is exported to."""
TUNNELS_DIR = "tunnels"
"""Where the watches of those projects open theirs (`<project>.sock`)."""
