#!/usr/bin/env bash
# Checks the Helm chart charts/brainstorm and the generated manifests/brainstorm.yaml, offline.
#   tests/deploy/check_chart.sh            lint, render, validate, assert; exit 1 on any failure
#   tests/deploy/check_chart.sh --write    regenerate manifests/brainstorm.yaml first
# The Python venv lives at ${BR_VENV:-$HOME/.cache/brainstorm/venv}; packages are installed only when missing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${BR_VENV:-$HOME/.cache/brainstorm/venv}"
python="$venv/bin/python"

if [[ ! -x "$python" ]]; then
  echo "check_chart: creating the Python venv $venv" >&2
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
fi

# PyPI requirement, and the module that proves it is installed.
requirements=(
  "helm-python-sdk>=0.2.2,<0.3|helm_python"
  "kubernetes-validate>=1.37,<2|kubernetes_validate"
  "pyyaml>=6|yaml"
  "jsonschema>=4|jsonschema"
)
missing=()
for requirement in "${requirements[@]}"; do
  if ! "$python" -c "import ${requirement#*|}" 2>/dev/null; then
    missing+=("${requirement%|*}")
  fi
done
if (( ${#missing[@]} > 0 )); then
  echo "check_chart: installing ${missing[*]} into $venv" >&2
  "$python" -m pip install --quiet --disable-pip-version-check "${missing[@]}"
fi

exec "$python" "$here/check_chart.py" "$@"
