#!/usr/bin/env bash
# Runs the SDK end-to-end tests in a cached virtualenv (pinned SDKs; pip does nothing when satisfied).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${BR_VENV:-$HOME/.cache/brainstorm/venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$here" "$@"
