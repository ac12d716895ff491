#!/bin/sh
# Like the stock image: redis-server without a config file accepts connections from other
# containers (protected mode off; only the compose network can reach it, no port is published).
set -eu
if [ "${1:-}" = "redis-server" ]; then
    shift
    exec redis-server --protected-mode no --dir /data "$@"
fi
exec "$@"
