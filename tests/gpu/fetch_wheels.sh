#!/usr/bin/env bash
# Download, here (with network), the wheels the GPU machine lacks into .whl/ (git-ignored; carry it: ".whl").
#   PYTHON=.venv/bin/python tests/gpu/fetch_wheels.sh
# Each name in tests/gpu/wheels.txt at the version installed in $PYTHON, for CPython 3.12 on x86-64 Linux.
set -euo pipefail
cd "$(dirname "$0")/../.."
python="${PYTHON:-.venv/bin/python}"
dest="${NBHW_GPU_WHEELS:-.whl}"
mapfile -t names < <(grep -v -e '^#' -e '^\s*$' tests/gpu/wheels.txt)
mapfile -t specs < <("$python" -c '
import sys
from importlib.metadata import version
for name in sys.argv[1:]:
    print(f"{name}=={version(name)}")
' "${names[@]}")
rm -rf "$dest"
mkdir -p "$dest"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
"$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d "$dest" "${specs[@]}"
ls -1 "$dest"
du -sh "$dest"
