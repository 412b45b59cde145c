"""The real wheels scripts/setup.sh installs beside the venv, not in it (``pip install --target``).

Installed in the venv they would change what "this machine" is for every test: the pre-flight checks would find
kernels 0.17.2 outside transformers' accepted range, a process that once imported bitsandbytes keeps it in
sys.modules and in transformers' availability caches, and torchao logs on every transformers import. The tests that
need one put its folder on sys.path one test at a time (tests/core/hardware/test_doctor.py) or run in a child process
whose sys.path has it (tests/core/advice/test_quant_loads.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

TEST_DISTS = Path(os.environ.get("NBHW_TEST_DISTS") or Path(sys.prefix) / "nbhw-test-dists")
BITSANDBYTES = TEST_DISTS / "bitsandbytes-0.50.2"
KERNELS = TEST_DISTS / "kernels-0.17.2"
TORCHAO = TEST_DISTS / "torchao-0.18.0"
# The quantization packages loaded for real on CPU from beside the venv, by import name.
QUANTIZATION_DISTS = {"bitsandbytes": BITSANDBYTES, "torchao": TORCHAO}
