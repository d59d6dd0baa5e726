#!/usr/bin/env bash
# Makes sure a Kafka-protocol broker answers for the tests and prints its address (`127.0.0.1:PORT`) on
# stdout: `BR_TEST_KAFKA_BROKERS` when it answers, else the broker this script started earlier when it
# still runs, else a fresh `tansu` broker (memory storage) on a free port.
#
# tansu is installed once into $HOME/.cache/brainstorm/tools when it is not on PATH. A cold install
# builds from crates.io and takes about 9 minutes on 2 cores (debug build; release takes ~22); it runs
# under `nice` so it does not starve other work.
set -euo pipefail
log() { echo "ensure-kafka: $*" >&2; }

tools="$HOME/.cache/brainstorm/tools"
state="$HOME/.cache/brainstorm/kafka"
mkdir -p "$state"

answers() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
host_of() { local address="${1%%,*}"; echo "${address%:*}"; }
port_of() { local address="${1%%,*}"; echo "${address##*:}"; }

if [ -n "${BR_TEST_KAFKA_BROKERS:-}" ] && answers "$(host_of "$BR_TEST_KAFKA_BROKERS")" "$(port_of "$BR_TEST_KAFKA_BROKERS")"; then
  echo "$BR_TEST_KAFKA_BROKERS"
  exit 0
fi

# A broker started by an earlier run: reuse it while its process lives and its port answers.
if [ -f "$state/tansu.pid" ] && [ -f "$state/tansu.port" ]; then
  pid="$(cat "$state/tansu.pid")"
  port="$(cat "$state/tansu.port")"
  if kill -0 "$pid" 2>/dev/null && grep -q tansu "/proc/$pid/cmdline" 2>/dev/null && answers 127.0.0.1 "$port"; then
    echo "127.0.0.1:$port"
    exit 0
  fi
fi

tansu="$(command -v tansu || true)"
if [ -z "$tansu" ]; then
  tansu="$tools/bin/tansu"
  if [ ! -x "$tansu" ]; then
    log "installing tansu 0.6.0 into $tools (a cold build takes about 9 minutes)"
    nice -n 19 cargo install tansu --version 0.6.0 --locked --debug --features dynostore --root "$tools" >&2
  fi
fi

# A free port outside the kernel's ephemeral range, as the end-to-end tests pick theirs.
port="$(python3 "$(dirname "$0")/free_port.py")"
# tansu reads `.env` and LISTENER_URL-style variables from where it starts: start it from an empty
# directory with a clean environment so nothing but these flags configures it.
workdir="$(mktemp -d "$state/run.XXXXXX")"
(
  cd "$workdir"
  env -i PATH="/usr/bin:/bin" HOME="$HOME" RUST_LOG=warn setsid "$tansu" broker \
    --listener-url "tcp://127.0.0.1:$port" \
    --advertised-listener-url "tcp://127.0.0.1:$port" \
    --storage-engine "memory://tansu/" >"$state/tansu.log" 2>&1 &
  echo $! >"$state/tansu.pid"
)
echo "$port" >"$state/tansu.port"
for _ in $(seq 1 100); do
  if answers 127.0.0.1 "$port"; then
    log "tansu answers on 127.0.0.1:$port (pid $(cat "$state/tansu.pid"), log $state/tansu.log)"
    echo "127.0.0.1:$port"
    exit 0
  fi
  sleep 0.1
done
log "tansu did not start; see $state/tansu.log"
exit 1
