"""Training test helpers: TrainArguments for a method, a QLoRA cell's real peak, and 2-rank runs over gloo."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from nbhw.core.train import launch as L
from nbhw.core.train.arguments import train_args

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 0.10


def args_for(method: str, gc: bool, **extra: Any) -> Any:
    dtype = "bfloat16" if method == "qlora" else "float32"
    values = {"batch": 2, "context": 64, "lora_r": 8, "dtype": dtype, "device_type": "cpu", **extra}
    return train_args(method=method, gradient_checkpointing=gc, **values)


def run_cell(cell: str, folder: Path) -> list[float]:
    namespace: dict[str, Any] = {}
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        exec(compile(cell, "cell", "exec"), namespace)
    finally:
        os.chdir(cwd)
    return [h["loss"] for h in namespace["trainer"].state.log_history if "loss" in h]


def run_ranks(
    work: Path, *, accelerate: bool = False, fake_accelerator_types: bool = False
) -> tuple[int, list[dict[str, Any]], str]:
    """The launch files written in ``work`` run on 2 CPU ranks over gloo under tests/support/train_rank.py, started by
    torchrun or by ``accelerate launch`` with the emitted config: the exit code, each rank's peaks, stderr's tail.
    ``fake_accelerator_types``: train_rank.py's fake that lets accelerate take CPU processes for accelerators
    (FSDP through accelerate, TP's parallelism config); FSDP2 on CPU needs no fake since it shards at load."""
    extra = {"NBHW_TEST_FSDP_ON_CPU": "1"} if fake_accelerator_types else {}
    rank = [str(ROOT / "tests" / "support" / "train_rank.py"), str(work / "peaks"), L.SCRIPT_NAME]
    launcher = ["-m", "accelerate.commands.launch", "--config_file", L.ACCELERATE_CONFIG_NAME] if accelerate else None
    return two_ranks(work, rank, work / "peaks", launcher=launcher, env=extra)


def two_ranks(
    work: Path, rank: list[str], out: Path, *, launcher: list[str] | None = None, env: dict[str, str] | None = None
) -> tuple[int, list[dict[str, Any]], str]:
    """``rank`` (a script and its arguments) on 2 CPU ranks over gloo, in ``work``, started by torchrun (or by
    ``launcher``, a module taking ``--main_process_port``): the exit code, each rank's ``out/rank<N>.json``, and
    stderr's tail."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONPATH=str(ROOT), **(env or {}))
    # A free port each: two runs on the two xdist workers at once would otherwise both rendezvous on 29500, and one
    # rank joins the other run's store (seen once in CI as a rank killed by SIGABRT).
    port = str(_free_port())
    if launcher is not None:
        cmd = [sys.executable, *launcher, "--main_process_port", port, *rank]
    else:
        launch = ["-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2"]
        cmd = [sys.executable, *launch, "--master_port", port, *rank]
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600, check=False)
    files = [out / f"rank{r}.json" for r in (0, 1)]
    return done.returncode, [json.loads(f.read_text()) for f in files if f.exists()], done.stderr[-6000:]


def _free_port() -> int:
    """A TCP port on localhost that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
