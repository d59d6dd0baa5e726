#!/usr/bin/env bash
# Makes sure the load generator oha is installed (once, from crates.io, into
# $HOME/.cache/brainstorm/tools) and prints its path: for `make bench` and the release build's training.
set -euo pipefail
tools="$HOME/.cache/brainstorm/tools"
if [ ! -x "$tools/bin/oha" ]; then
  echo "installing oha (once, into $tools)" >&2
  cargo install oha --locked --root "$tools" >&2
fi
echo "$tools/bin/oha"
