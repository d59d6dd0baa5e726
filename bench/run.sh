#!/usr/bin/env bash
# `make bench`: builds the release binaries, makes sure the load generator (oha) is installed (cached
# under $HOME/.cache/brainstorm/tools), then runs bench/run.py.
set -euo pipefail
cd "$(dirname "$0")/.."
tools="$HOME/.cache/brainstorm/tools"
if [ ! -x "$tools/bin/oha" ]; then
  echo "bench: installing oha (once, into $tools)" >&2
  cargo install oha --locked --root "$tools"
fi
if ! command -v taskset >/dev/null 2>&1; then
  echo "bench: taskset is missing (util-linux): processes will not be pinned" >&2
fi
cargo build --release -p brainstorm -p brainstorm-mock-upstream
target="${CARGO_TARGET_DIR:-target}"
exec python3 bench/run.py --gateway "$target/release/brainstorm" --mock "$target/release/mock-upstream" --oha "$tools/bin/oha" "$@"
