#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a .venv with the CPU build of torch and nbhw installed in editable mode.
#   scripts/setup.sh lab    nbhw + JupyterLab and Notebook 7 (for the quickstart)
#   scripts/setup.sh docs   nbhw + Sphinx, myst-nb and furo (for scripts/docs.sh, the documentation site)
#   scripts/setup.sh test   nbhw + everything the tests need (the docs included), and Debian's chromium for the browser tests
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-test}"
python="${PYTHON:-python3}"

[ -x .venv/bin/python ] || "$python" -m venv .venv
# Install torch first, pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
# The rest at the versions the suite last passed with (scripts/constraints.txt says why and how to refresh it).
pins=(-c scripts/constraints.txt)
case "$what" in
  lab) .venv/bin/python -m pip install -q --disable-pip-version-check "${pins[@]}" -e ".[lab]" ;;
  docs) .venv/bin/python -m pip install -q --disable-pip-version-check "${pins[@]}" -e ".[docs]" ;;
  test) .venv/bin/python -m pip install -q --disable-pip-version-check "${pins[@]}" -e ".[test]" ;;
  *) echo "usage: scripts/setup.sh [lab|docs|test]" >&2; exit 2 ;;
esac

# Real wheels the pre-flight tests (tests/core/hardware/test_doctor.py) put on sys.path one test at a time, and the quantization
# loads (tests/core/advice/test_quant_loads.py) run in a child process that has them. Not in the venv: installed there they
# would change what "this machine" is for every other test (kernels 0.17.2 is outside transformers 5.24's accepted
# range, a finding of its own; torchao logs on every transformers import). The tests look in $NBHW_TEST_DISTS,
# default here (tests/support/dists.py).
if [ "$what" = test ]; then
  for pin in bitsandbytes==0.50.2 kernels==0.17.2 torchao==0.18.0; do
    dest=".venv/nbhw-test-dists/${pin/==/-}"
    [ -d "$dest" ] || .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --target "$dest" "$pin"
  done
fi

# The browser tests drive /usr/bin/chromium itself (Playwright's own browser download can't be used): check that path.
if [ "$what" = test ] && [ ! -x /usr/bin/chromium ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
echo "nbhw set up in .venv ($what)"
