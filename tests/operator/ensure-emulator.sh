#!/usr/bin/env bash
# Makes sure a cached virtualenv has kmock (the Kubernetes API emulator of tests/operator.rs) and
# prints its python, for BR_KUBE_EMULATOR_PYTHON. pip does nothing when satisfied. A virtualenv of its
# own: kmock registers a pytest plugin that the SDK suite's virtualenv must not load.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${BR_KUBE_VENV:-$HOME/.cache/brainstorm/kube-venv}"
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv" >&2
fi
"$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt" >&2
echo "$venv/bin/python"
