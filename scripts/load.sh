#!/usr/bin/env bash
# Measures one edge node with the load tool, each part in its own process:
# redis-server, nats-server (built from the module's dependency), a fresh
# `presenced node`, and presence-load. Loopback only; everything it starts
# is stopped on exit.
#   scripts/load.sh idle      15,000 idle sessions: RSS and CPU per session
#   scripts/load.sh latency   1,000 joins/s: join -> online on NATS, p50/p99
#   scripts/load.sh storm     1,000 joins at once into a room of 10,000
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-idle}
bin=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$bin"' EXIT

go build -o "$bin/presenced" ./cmd/presenced
go build -o "$bin/presence-load" ./cmd/presence-load
go build -o "$bin/nats-server" github.com/nats-io/nats-server/v2

redis-server --port 6391 --bind 127.0.0.1 --save '' --appendonly no --dir "$bin" --loglevel warning &
"$bin/nats-server" -a 127.0.0.1 -p 4231 -js -sd "$bin/js" >/dev/null 2>&1 &
sleep 1
# Clients authenticate with HS256 tokens, as in production (each open
# connection then holds its token's expiry timer).
secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
"$bin/presenced" node --jwt-secret "$secret" --region load --redis 127.0.0.1:6391 \
  --nats nats://127.0.0.1:4231 --listen 127.0.0.1:8091 --log-level warn ${PPROF:+--pprof-listen 127.0.0.1:6061} 2>"$bin/node.log" &
for _ in $(seq 50); do curl -sf http://127.0.0.1:8091/healthz >/dev/null && break; sleep 0.2; done

case $mode in
idle)    "$bin/presence-load" idle --addr 127.0.0.1:8091 --jwt-secret "$secret" --sessions 15000 --hold 60s ;;
latency) "$bin/presence-load" latency --addr 127.0.0.1:8091 --jwt-secret "$secret" --nats nats://127.0.0.1:4231 --region load --rate 1000 --duration 10s ;;
storm)   "$bin/presence-load" storm --addr 127.0.0.1:8091 --jwt-secret "$secret" --members 10000 --joiners 1000 ;;
*) echo "usage: $0 idle|latency|storm" >&2; exit 2 ;;
esac
