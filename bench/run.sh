#!/usr/bin/env bash
# `make bench`: builds the release binaries (the gateway's profile-guided: scripts/release-pgo.sh),
# makes sure the load generator (oha) is installed (scripts/ensure-oha.sh), then runs bench/run.py.
set -euo pipefail
cd "$(dirname "$0")/.."
oha="$(scripts/ensure-oha.sh)"
if ! command -v taskset >/dev/null 2>&1; then
  echo "bench: taskset is missing (util-linux): processes will not be pinned" >&2
fi
# The gateway as shipped: the profile-guided release build of `make release` (the plain release build
# where llvm-profdata is missing, or with BR_PGO=0); the mock upstream is a plain release build.
gateway="$(scripts/release-pgo.sh)"
# The mock upstream and phase l's stack-relay (the gateway's HTTP stack alone): plain release builds.
cargo build --release -p brainstorm-mock-upstream -p brainstorm-stack-relay
target="${CARGO_TARGET_DIR:-target}"
case "$gateway" in
  */pgo/use/*) build="release, profile-guided (scripts/release-pgo.sh)" ;;
  *) build="release, without profile-guided optimisation" ;;
esac
exec python3 bench/run.py --gateway "$gateway" --build "$build" --mock "$target/release/mock-upstream" --relay "$target/release/stack-relay" --oha "$oha" "$@"
