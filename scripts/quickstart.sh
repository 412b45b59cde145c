#!/usr/bin/env bash
# Set up (once) and open the quickstart notebook in JupyterLab.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh lab
extra=()
[ "$(id -u)" -ne 0 ] || extra+=(--allow-root)
exec .venv/bin/jupyter lab "${extra[@]}" "$@" notebooks/quickstart.ipynb
