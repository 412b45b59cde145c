#!/usr/bin/env bash
# nbhw's GPU verification in one call on a lent GPU machine (no network there). From the repository root:
#   bash tests/gpu/run_on_device.sh [-- PYTEST_ARGS]
# carrying ".whl" (made here, with network, by tests/gpu/fetch_wheels.sh). It installs the carried wheels into a
# private folder, puts this working tree first on PYTHONPATH (nbhw travels as source), then runs tests/gpu/driver.py:
# the gpu tests, $OUT/results.json + junit.xml + pytest.log, and a short table. Exit 0: passed (or no GPU, all skipped).
# Through a device tool that copies the working tree: command "bash tests/gpu/run_on_device.sh", carry [".whl"],
# a timeout of about 540 s (the driver stops pytest at 480 s).
set -u
cd "$(dirname "$0")/../.."
python="${PYTHON:-python3}"
wheels="${NBHW_GPU_WHEELS:-.whl}"
site="${NBHW_GPU_SITE:-/tmp/nbhw-gpu-site}"
out="${OUT:-$(mktemp -d /tmp/nbhw-gpu-results.XXXXXX)}"

extra=""
if compgen -G "$wheels/*.whl" >/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl \
    || { echo "nbhw GPU suite: installing the carried wheels from $wheels failed" >&2; exit 3; }
  extra="$site"
fi
export PYTHONPATH="$PWD${extra:+:$extra}${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
[ "${1:-}" = "--" ] && shift
exec "$python" -m tests.gpu.driver --out "$out" -- "$@"
