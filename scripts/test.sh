#!/usr/bin/env bash
# Everything `make test` runs: unit and store tests on both engines, end-to-end tests of the binary
# in both shapes, the operator against an emulated Kubernetes API, the Kafka bus on a real broker, the official SDKs against the gateway, the
# deployment checks, and the benchmark harness's own unit tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export BR_TEST_POSTGRES_URL="$(scripts/ensure-postgres.sh)"
export BR_TEST_REDIS_URL="$(scripts/ensure-redis.sh)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/brainstorm-target}"
# The Kubernetes API emulator the operator's end-to-end test runs against (kmock, in the tests' venv).
export BR_KUBE_EMULATOR_PYTHON="$(tests/operator/ensure-emulator.sh)"
# nginx terminates TLS in front of the gateway in the SDK ingress mTLS test (Debian's nginx-light).
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ] && command -v apt-get >/dev/null 2>&1; then
  apt-get install -y -q nginx-light >/dev/null || echo "scripts/test.sh: cannot install nginx-light; the SDK ingress mTLS test needs nginx" >&2
fi

drop_test_databases() {
  psql "$BR_TEST_POSTGRES_URL" -Atqc "SELECT datname FROM pg_database WHERE datname ~ '^brainstorm_(test|e2e|sdk)_[0-9a-f]{32}$'" |
    while read -r name; do psql "$BR_TEST_POSTGRES_URL" -qc "DROP DATABASE IF EXISTS $name WITH (FORCE)" >/dev/null; done
}
drop_test_databases
trap drop_test_databases EXIT

echo "== the OpenAPI document is what the edge's routes give (scripts/gen-openapi.py --check)"
python3 scripts/gen-openapi.py --check
echo "== benchmark harness (its parsing helpers)"
python3 -m unittest discover -s bench -p 'test_*.py'
echo "== cargo build (binary)"
cargo build -p brainstorm -p brainstorm-mock-upstream
echo "== cargo test (unit, store suites on SQLite and PostgreSQL, end-to-end in both shapes)"
cargo test --workspace
echo "== Kafka bus and the audit path over Kafka (librdkafka's mock cluster, then a real tansu broker)"
export BR_TEST_KAFKA_BROKERS="$(scripts/ensure-kafka.sh)"
cargo test -p brainstorm-common -p brainstorm-audit-lineage \
  --features brainstorm-common/kafka,brainstorm-audit-lineage/kafka --test kafka_bus --test kafka_audit
echo "== the distributed shape on Kafka (two edges, an audit-lineage crash, a kill switch across edges)"
cargo build -p brainstorm --features kafka
cargo test -p brainstorm-e2e --features kafka --test kafka
echo "== SDK end-to-end tests (official openai and anthropic clients)"
BR_BINARY="$CARGO_TARGET_DIR/debug/brainstorm" BR_MOCK_UPSTREAM="$CARGO_TARGET_DIR/debug/mock-upstream" tests/sdk/run.sh
if [ -x tests/deploy/check_chart.sh ]; then
  echo "== Helm chart and manifests"
  tests/deploy/check_chart.sh
fi
echo "== all tests passed"
