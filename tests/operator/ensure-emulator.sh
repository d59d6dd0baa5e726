#!/usr/bin/env bash
# Makes sure the tests' cached virtualenv has kmock (the Kubernetes API emulator of tests/operator.rs)
# and prints that virtualenv's python, for BR_KUBE_EMULATOR_PYTHON. pip does nothing when satisfied.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${BR_VENV:-$HOME/.cache/brainstorm/venv}"
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv" >&2
fi
"$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt" >&2
echo "$venv/bin/python"
