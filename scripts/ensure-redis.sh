#!/usr/bin/env bash
# Makes sure a Redis server answers for the tests and prints its URL on stdout: the machine's when one
# answers, otherwise a private one started on port 56379 (installed from Debian's packages if missing).
set -euo pipefail
url="${BR_TEST_REDIS_URL:-redis://127.0.0.1:6379}"
log() { echo "ensure-redis: $*" >&2; }
host_port="${url#redis://}"; host="${host_port%%:*}"; port="${host_port##*:}"; port="${port%%/*}"

answers() { (exec 3<>"/dev/tcp/$1/$2" && printf 'PING\r\n' >&3 && timeout 2 head -c 5 <&3 | grep -q PONG) 2>/dev/null; }

if answers "$host" "$port"; then echo "$url"; exit 0; fi
if ! command -v redis-server >/dev/null 2>&1; then
  log "installing redis-server"
  apt-get install -y -q redis-server >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q redis-server >/dev/null; }
fi
private_port=56379
if ! answers 127.0.0.1 "$private_port"; then
  log "starting a private Redis on port $private_port"
  redis-server --bind 127.0.0.1 --port "$private_port" --daemonize yes --save '' --appendonly no >&2
  for _ in $(seq 1 50); do answers 127.0.0.1 "$private_port" && break; sleep 0.1; done
fi
answers 127.0.0.1 "$private_port" || { log "the private Redis does not answer"; exit 1; }
echo "redis://127.0.0.1:$private_port"
