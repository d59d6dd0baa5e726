#!/usr/bin/env bash
# Makes sure a PostgreSQL server answers for the tests and prints its admin URL on stdout.
# Uses the machine's server when one answers, starts the machine's cluster when it is installed but
# stopped, and otherwise runs a private cluster under $HOME/.cache/brainstorm/postgres.
set -euo pipefail
url="${BR_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
log() { echo "ensure-postgres: $*" >&2; }

answers() { pg_isready -q -d "$1" 2>/dev/null && psql "$1" -Atqc 'SELECT 1' >/dev/null 2>&1; }

if answers "$url"; then echo "$url"; exit 0; fi

if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
  version="$(ls /etc/postgresql | sort -V | tail -n 1)"
  log "starting the machine's PostgreSQL $version cluster"
  pg_ctlcluster --skip-systemctl-redirect "$version" main start >&2 || true
  for _ in $(seq 1 50); do answers "$url" && { echo "$url"; exit 0; }; sleep 0.2; done
fi

bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
[ -n "$bin" ] || { log "no PostgreSQL server binaries found (apt-get install postgresql)"; exit 1; }
data="$HOME/.cache/brainstorm/postgres"
port=55432
private="postgres://postgres@127.0.0.1:$port/postgres"
if answers "$private"; then echo "$private"; exit 0; fi
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if [ ! -f "$data/PG_VERSION" ]; then
  log "creating a private cluster in $data"
  mkdir -p "$data"
  [ "$(id -u)" = 0 ] && chown postgres "$data"
  as_postgres "$bin/initdb" -D "$data" -A trust -U postgres >&2
fi
log "starting the private cluster on port $port"
as_postgres "$bin/pg_ctl" -D "$data" -l "$data/server.log" -o "-c listen_addresses=127.0.0.1 -p $port -k $data -c fsync=off" -w start >&2
answers "$private" || { log "the private cluster does not answer"; exit 1; }
echo "$private"
