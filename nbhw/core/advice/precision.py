"""dtype advice for one device, for inference (``from_pretrained(dtype=...)``) and training (``TrainingArguments``).

The hardware facts (bf16 / fp16 / tf32, compute capability) come from nbhw's detection (:class:`DeviceInfo`);
the distributed backend a launcher would use comes from accelerate's own ``PartialState._prepare_backend``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import lru_cache

from nbhw.core.hardware import probes
from nbhw.core.hardware.data import DeviceInfo
from nbhw.core.hf import library_source

DTYPES = ("float32", "float16", "bfloat16", "auto")
AMPERE = 8  # compute capability major of Ampere: native bf16 and tf32 (torch.cuda.is_bf16_supported's rule)


@dataclass
class DtypeAdvice:
    """What dtype to load and train with on one device, and why."""

    device: str
    dtype: str
    reason: str
    tf32: str | None
    training: str
    training_reason: str
    launch: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _cuda_capability_major(info: DeviceInfo | None) -> int | None:
    cc = info.compute_capability if info else None
    if not cc or not cc[0].isdigit():
        return None
    return int(cc.split(".")[0])


def _nvidia(info: DeviceInfo | None) -> tuple[str, str, str | None, str, str]:
    major = _cuda_capability_major(info)
    tf32 = (
        "torch.backends.cuda.matmul.allow_tf32 = True (or torch.set_float32_matmul_precision('high')) "
        "speeds float32 matmuls on Ampere or newer"
    )
    if major is None and (info is None or info.bf16 is None):
        return (
            "bfloat16",
            "bfloat16 on Ampere or newer (compute capability >= 8.0), float16 on older GPUs; "
            "the GPU isn't here to check",
            tf32 + " (if this GPU is Ampere or newer)",
            "TrainingArguments(bf16=True) on Ampere or newer, TrainingArguments(fp16=True) before",
            "bf16 keeps float32's range (no loss scaling); before Ampere bf16 is emulated, so use fp16",
        )
    if (info is not None and info.bf16) or (major is not None and major >= AMPERE):
        cc = info.compute_capability if info else None
        return (
            "bfloat16",
            f"compute capability {cc} (Ampere or newer) runs bf16 natively, with float32's range",
            tf32,
            "TrainingArguments(bf16=True, tf32=True)",
            "bf16 mixed precision needs no loss scaling; tf32 speeds the float32 parts",
        )
    cc = info.compute_capability if info else "?"
    return (
        "float16",
        f"compute capability {cc} is older than Ampere (8.0): bf16 is emulated and slow, float16 is native",
        None,
        "TrainingArguments(fp16=True)",
        "fp16 mixed precision with loss scaling; bf16 and tf32 need Ampere or newer",
    )


def _rocm(info: DeviceInfo | None) -> tuple[str, str, str | None, str, str]:
    tf32 = None
    if info is not None and info.tf32:
        tf32 = f"{info.compute_capability} supports tf32: torch.backends.cuda.matmul.allow_tf32 = True"
    return (
        "bfloat16",
        "ROCm GPUs run bf16 natively (torch.cuda.is_bf16_supported() is True on ROCm)",
        tf32,
        "TrainingArguments(bf16=True" + (", tf32=True)" if tf32 else ")"),
        "bf16 mixed precision needs no loss scaling",
    )


def _cpu(info: DeviceInfo | None) -> tuple[str, str, str | None, str, str]:
    native = probes.cpu_native_bf16()
    if native:
        return (
            "bfloat16",
            "this CPU has native bf16 (AVX512-BF16 / AMX or Apple arm64): half the memory of float32 at full speed",
            None,
            "TrainingArguments(use_cpu=True, bf16=True)",
            "use_cpu=True forces the CPU; bf16 autocast runs natively here",
        )
    why = "no native bf16 on this CPU (no AVX512-BF16 / AMX)" if native is False else "bf16 support unknown"
    return (
        "float32",
        f"{why}: bf16 halves memory but runs slower than float32; float16 on CPU is slower still",
        None,
        "TrainingArguments(use_cpu=True)",
        "use_cpu=True forces the CPU; keep float32 (bf16 would be emulated)",
    )


def _mps(info: DeviceInfo | None) -> tuple[str, str, str | None, str, str]:
    bf16 = "bf16 works too (macOS 14 or newer)" if info and info.bf16 else "bf16 needs macOS 14 or newer"
    return (
        "float16",
        f"Apple GPUs run float16 natively on every macOS version; {bf16}",
        None,
        "TrainingArguments(fp16=True)",
        "TrainingArguments picks mps by itself; fp16 mixed precision runs on MPS",
    )


def _other(info: DeviceInfo | None, device_type: str) -> tuple[str, str, str | None, str, str]:
    if info is not None and info.bf16:
        return (
            "bfloat16",
            f"{device_type} reports native bf16",
            None,
            "TrainingArguments(bf16=True)",
            f"bf16 mixed precision; TrainingArguments finds {device_type} through accelerate",
        )
    if info is not None and info.bf16 is False:
        why = f"{device_type} reports no bf16"
        return ("float16", why, None, "TrainingArguments(fp16=True)", "fp16 mixed precision")
    return (
        "bfloat16",
        f"bf16 is the usual choice on {device_type}; the device isn't here to confirm it",
        None,
        "TrainingArguments(bf16=True)",
        f"bf16 mixed precision; TrainingArguments finds {device_type} through accelerate",
    )


@lru_cache(maxsize=1)
def distributed_backends() -> dict[str, str]:
    """Device family -> torch.distributed backend, read from accelerate: ``PartialState._prepare_backend``'s branches
    (up to 1.15 one per family; from 1.16 only xla), and the ``TORCH_DISTRIBUTED_BACKENDS`` table it looks up."""
    path = library_source.library_file("accelerate", "state.py")
    source = library_source.function_source(path, "PartialState._prepare_backend") if path else None
    found: dict[str, str] = {}
    if source is None:
        return found
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If):
            probe = library_source._probe_of(node.test)
            if probe is None:
                continue
            for stmt in ast.walk(ast.Module(body=node.body, type_ignores=[])):
                if (
                    isinstance(stmt, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "backend" for t in stmt.targets)
                    and isinstance(stmt.value, ast.Constant)
                ):
                    found.setdefault(probe, str(stmt.value.value))
                    break
    if "get_distributed_backend(" in source:  # 1.16: the table, looked up by torch's accelerator
        table = library_source.constant_mapping("accelerate", "utils/constants.py", "TORCH_DISTRIBUTED_BACKENDS")
        for family, backend in table.items():
            found.setdefault(family, backend)
    return found


def _launch(device_type: str, count: int) -> tuple[list[str], list[str]]:
    if count < 2:
        return [], []
    family = "cuda" if device_type in {"cuda", "rocm"} else device_type
    backend = distributed_backends().get(family)
    lines = [f"torchrun --nproc_per_node={count} train.py", f"accelerate launch --num_processes {count} train.py"]
    if backend == "nccl":
        rccl = " (RCCL on ROCm, under the same name)" if device_type == "rocm" else ""
        note = f"one process per GPU; torch.distributed uses the NCCL backend{rccl}, as accelerate picks it"
    elif backend:
        note = f"one process per device; accelerate picks the {backend!r} torch.distributed backend for {family}"
    else:
        note = "one process per device"
    return lines, [note]


def advise(device: str, device_type: str, info: DeviceInfo | None, count: int = 1) -> DtypeAdvice:
    """dtype for loading and the TrainingArguments flags for one device (``device_type`` as transformers names it)."""
    rules = {"cuda": _nvidia, "rocm": _rocm, "cpu": _cpu, "mps": _mps}
    rule = rules.get(device_type)
    dtype, reason, tf32, training, training_reason = rule(info) if rule else _other(info, device_type)
    launch, notes = _launch(device_type, count)
    return DtypeAdvice(device, dtype, reason, tf32, training, training_reason, launch, notes)
