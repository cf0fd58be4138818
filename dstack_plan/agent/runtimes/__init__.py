"""How jobs run: `docker_runtime` (containers via the docker SDK) and `process_runtime`."""
