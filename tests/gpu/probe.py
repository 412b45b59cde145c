"""Checks that must run in a fresh Python: ``python -m tests.gpu.probe CHECK [ARG]`` prints one JSON line last.

A fresh process is where "nbhw created no CUDA context" can be told honestly: torch's initialised flag and NVML's
list of processes holding GPU memory start clean, and nothing the test process did counts. Each check reports facts
only; the tests in this folder judge them.

  context WHAT [MODEL]   run nbhw's detect / report / attention / plan, then say whether a CUDA context exists;
                         then create one on purpose (the control: shows NVML can see this process at all)
  detect                 nbhw's devices, then (after) torch's device properties and bf16/tf32 answers
  visible                nbhw's cuda:N mapping before CUDA starts, torch's after, and nbhw's again after
  load MODEL             plan MODEL, check no context, run the emitted cell, measure torch's allocation
  serve MODEL CONTEXT    nbhw's serving plan, then the manager transformers makes on the card with its config
  preflight              nbhw.doctor() and detect(), then: a context? a forked child in torch's bad-fork state?
                         the arch list read from torch's binary against torch.cuda.get_arch_list(), and each
                         GPU's predicted verdict against a real kernel launch on it (CUDA started on purpose)
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def nvml_processes() -> dict[str, Any]:
    """PIDs holding memory on any GPU, and used bytes per GPU, from pynvml directly (no CUDA context)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        return {"nvml_error": f"{type(exc).__name__}: {exc}", "pids": [], "used": []}
    try:
        pids: set[int] = set()
        used = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            used.append(int(pynvml.nvmlDeviceGetMemoryInfo(h).used))
            for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                fn = getattr(pynvml, getter, None)
                if fn is not None:
                    pids.update(int(p.pid) for p in fn(h))
        return {"nvml_error": None, "pids": sorted(pids), "used": used}
    finally:
        pynvml.nvmlShutdown()


def context_state() -> dict[str, Any]:
    """Whether this process has a CUDA context: torch's flag (without importing torch) and NVML's process list."""
    torch = sys.modules.get("torch")
    state: dict[str, Any] = {
        "torch_imported": torch is not None,
        "initialized": bool(torch is not None and torch.cuda.is_initialized()),
    }
    state.update(nvml_processes())
    state["listed"] = os.getpid() in state["pids"]
    return state


def control() -> dict[str, Any] | None:
    """Create a context on purpose and read the same signals: they must show it, or they prove nothing."""
    import torch

    if not torch.cuda.is_available():
        return None
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    return context_state()


def _detect(_: str | None) -> dict[str, Any]:
    import nbhw

    hw = nbhw.detect()
    return {"usable": [b.key for b in hw.usable], "devices": [d.device for d in hw.devices]}


def _report(_: str | None) -> dict[str, Any]:
    import nbhw

    data = nbhw.report().to_dict()
    return {"torch": data["torch"], "nvidia": data["nvidia"]}


def _attention(_: str | None) -> dict[str, Any]:
    import nbhw

    advice = nbhw.attention()
    return {"device": advice.device, "live": advice.live, "rows": {r.key: r.status for r in advice.rows}}


def _plan(model: str | None) -> dict[str, Any]:
    import nbhw

    plan = nbhw.plan(model)
    problems = plan.check()
    assert plan.estimate is not None and plan.placement is not None
    return {
        "code_lines": len(plan.code.splitlines()),
        "problems": problems,
        "bytes": plan.estimate.total_bytes,
        "device_map": {k: str(v) for k, v in plan.placement.device_map.items()},
        "verdict": plan.placement.verdict,
    }


def _doctor(_: str | None) -> dict[str, Any]:
    import nbhw

    result = nbhw.doctor()
    return {"findings": [f.id for f in result.findings], "checks": {c.name: c.status for c in result.checks}}


CALLS = {"detect": _detect, "report": _report, "attention": _attention, "plan": _plan, "doctor": _doctor}


def context(what: str, model: str | None = None) -> dict[str, Any]:
    """Run one of nbhw's entry points, then read the context signals, then the control."""
    before = context_state()
    said = CALLS[what](model)
    after = context_state()
    return {"pid": os.getpid(), "what": what, "said": said, "before": before, "after": after, "control": control()}


def _nbhw_device(d: Any) -> dict[str, Any]:
    return {
        "device": d.device,
        "name": d.name,
        "total_memory": d.total_memory,
        "compute_capability": d.compute_capability,
        "bf16": d.bf16,
        "tf32": d.tf32,
        "uuid": d.details.get("uuid"),
        "nvml_index": d.details.get("nvml_index"),
        "notes": list(d.notes),
    }


def _torch_device(torch: Any, index: int) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    with torch.cuda.device(index):
        bf16 = bool(torch.cuda.is_bf16_supported(including_emulation=False))
        tf32_fn = getattr(torch.cuda, "is_tf32_supported", None)
        tf32 = bool(tf32_fn()) if tf32_fn is not None else props.major >= 8
    return {
        "device": f"cuda:{index}",
        "name": str(props.name),
        "total_memory": int(props.total_memory),
        "compute_capability": f"{props.major}.{props.minor}",
        "bf16": bf16,
        "tf32": tf32,
        "uuid": str(props.uuid),
    }


def detect_facts(_: str | None = None) -> dict[str, Any]:
    """nbhw's view first (no context), then torch's (which starts CUDA), then transformers' own bf16/tf32 answers."""
    import nbhw

    hw = nbhw.detect()
    row = hw.backend("cuda")
    ours = [_nbhw_device(d) for d in row.devices]
    state = context_state()
    import torch
    from transformers.utils import import_utils

    theirs = [_torch_device(torch, i) for i in range(torch.cuda.device_count())]
    return {
        "usable": row.usable,
        "reason": row.reason,
        "nbhw": ours,
        "context_after_detect": state,
        "torch": theirs,
        "torch_version": str(torch.__version__),
        "transformers": {
            "bf16": bool(import_utils.is_torch_bf16_gpu_available()),
            "tf32": bool(import_utils.is_torch_tf32_available()),
        },
    }


def _mapping(hw: Any) -> dict[str, Any]:
    row = hw.backend("cuda")
    return {
        "usable": row.usable,
        "reason": row.reason,
        "notes": list(row.notes),
        "devices": [{"device": d.device, "uuid": d.details.get("uuid"), "name": d.name} for d in row.devices],
        "exact": hw.env.gpu_order_exact,
        "warnings": list(hw.env.warnings),
    }


def visible_facts(_: str | None = None) -> dict[str, Any]:
    """How cuda:N maps under this process's CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER: nbhw before, torch, nbhw after."""
    import nbhw

    before = _mapping(nbhw.detect())
    initialized_before_torch = context_state()["initialized"]
    import torch

    count = torch.cuda.device_count()
    theirs = []
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        theirs.append({"device": f"cuda:{i}", "uuid": str(props.uuid), "name": str(props.name)})
    return {
        "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")},
        "nbhw_before": before,
        "initialized_by_nbhw": initialized_before_torch,
        "torch": theirs,
        "torch_initialized": bool(torch.cuda.is_initialized()),
        "nbhw_after": _mapping(nbhw.detect()),
    }


def _tensors(model: Any) -> list[Any]:
    return list(model.parameters()) + list(model.buffers())


def load_facts(model_path: str | None) -> dict[str, Any]:
    """Plan the model (defaults: device_map="auto", dtype="auto"), then run the cell nbhw wrote and measure it."""
    import nbhw

    plan = nbhw.plan(model_path)
    problems = plan.check()
    estimate, placement = plan.estimate, plan.placement
    assert estimate is not None and placement is not None
    planned = context_state()
    import torch

    cuda = torch.cuda.is_available()
    allocated_before = int(torch.cuda.memory_allocated(0)) if cuda else None
    namespace: dict[str, Any] = {}
    started = time.perf_counter()
    exec(compile(plan.code, "<plan.code>", "exec"), namespace)  # the user's cell, as nbhw wrote it
    seconds = time.perf_counter() - started
    if cuda:
        torch.cuda.synchronize()
    loaded = namespace["model"]
    tensors = _tensors(loaded)
    return {
        "code": plan.code,
        "problems": problems,
        "estimate": estimate.to_dict(),
        "placement": placement.to_dict(),
        "context_after_planning": planned,
        "allocated_before": allocated_before,
        "allocated_after": int(torch.cuda.memory_allocated(0)) if cuda else None,
        "loaded_bytes": sum(t.numel() * t.element_size() for t in tensors),
        "parameters": sum(p.numel() for p in loaded.parameters()),
        "devices": sorted({str(t.device) for t in tensors}),
        "dtypes": sorted({str(p.dtype) for p in loaded.parameters()}),
        "hf_device_map": {k: str(v) for k, v in (getattr(loaded, "hf_device_map", None) or {}).items()},
        "cell_seconds": round(seconds, 2),
    }


def _process_used(pid: int) -> int | None:
    """This process's device memory as NVML counts it on GPU 0 (context, workspaces, the caching allocator's pool)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if int(p.pid) == pid and p.usedGpuMemory is not None:
                return int(p.usedGpuMemory)
        return None
    finally:
        pynvml.nvmlShutdown()


def generate_facts(model_path: str, contexts: str) -> dict[str, Any]:
    """Per context: nbhw's plan on cuda:0 (context tokens, batch 1), then the model loaded and generate() run for real
    at that context (context - 1 prompt tokens, one new token); torch's peak allocated bytes against the plan's device
    peak. Then the framework reserve measured: NVML's bytes for this process minus torch's reserved pool."""
    import torch

    import nbhw

    found: dict[str, Any] = {"runs": []}
    before = nvml_processes()["used"]  # GPU 0's used bytes before this process has a context
    model = None
    for tokens in (int(c) for c in contexts.split(",")):
        plan = nbhw.plan(model_path, device_map=0, context=tokens)
        assert plan.placement is not None and plan.estimate is not None
        share = next(d for d in plan.placement.devices if d.device == "cuda:0")
        if model is None:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(model_path, device_map=0)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(0)
        prompt = torch.randint(0, model.config.vocab_size, (1, tokens - 1), device="cuda:0")
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=1, min_new_tokens=1, do_sample=False)
        torch.cuda.synchronize()
        found["runs"].append({
            "context": tokens, "planned_peak": share.peak_bytes, "planned_cache": plan.estimate.cache_bytes,
            "planned_reserve": share.reserve_bytes, "measured_peak": int(torch.cuda.max_memory_allocated(0)),
            "kernels": plan.run.kernels if plan.run is not None else None,
        })  # fmt: skip
    used = _process_used(os.getpid())  # None where NVML can't see this PID (a container's PID namespace)
    if used is None and before:
        free, total = torch.cuda.mem_get_info(0)
        used = total - free - before[0]
    found["reserve_measured"] = None if used is None else used - int(torch.cuda.memory_reserved(0))
    found["reserve_stated"] = found["runs"][0]["planned_reserve"]
    return found


def forked_child_in_bad_fork() -> bool:
    """Whether a child forked now finds torch in its bad-fork state (it could not start CUDA)."""
    import torch

    pid = os.fork()
    if pid == 0:
        os._exit(3 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 3


def _launch(torch: Any, device: str) -> str:
    try:
        (torch.ones(4, device=device) * 2).sum().item()
    except RuntimeError as exc:
        return "no kernel image" if "no kernel image" in str(exc) else f"other: {' '.join(str(exc).split())[:200]}"
    return "runs"


def preflight_facts() -> dict[str, Any]:
    """nbhw's pre-flight checks first (no CUDA), then the ground truth they predict (CUDA started on purpose)."""
    import torch  # a notebook has imported it before it asks: its import is not the checks' time

    import nbhw
    from nbhw.core.hardware import cuda_arch, doctor

    started = time.perf_counter()
    result = nbhw.doctor()
    seconds = time.perf_counter() - started
    nbhw.detect()  # the devices view reads the arch list too (its per-GPU note)
    facts = doctor.torch_facts()
    assert facts is not None
    gpus = doctor.gpus(facts)
    predicted = {g.device: cuda_arch.verdict(cuda_arch.codes(facts.arch_list), g.capability or (0, 0)) for g in gpus}
    state = {"context": context_state(), "bad_fork_child_after_nbhw": forked_child_in_bad_fork()}
    listed = [str(a) for a in torch.cuda.get_arch_list()]  # arms the fork trap: the control below shows it
    state["bad_fork_child_after_get_arch_list"] = forked_child_in_bad_fork()
    real = {f"cuda:{i}": _launch(torch, f"cuda:{i}") for i in range(torch.cuda.device_count())}
    return {
        **state,
        "findings": [f.id for f in result.findings],
        "doctor_seconds": round(seconds, 3),
        "arch_from_binary": list(facts.arch_list),
        "arch_source": facts.arch_source,
        "get_arch_list": listed,
        "predicted": predicted,
        "real": real,
        "capabilities": {g.device: g.capability for g in gpus},
    }


def tight_facts(model_path: str, spare: str) -> dict[str, Any]:
    """A budget of the loaded weights, the stated reserve and ``spare`` bytes: nbhw's plan for a left-padded batch of
    2 at the longest context it says fits there, then generate() run for real at that context under torch's cap of
    the same budget (set_per_process_memory_fraction caps the caching allocator's pool: fragmentation included)."""
    import torch
    from transformers import AutoModelForCausalLM

    import nbhw

    model = AutoModelForCausalLM.from_pretrained(model_path, device_map=0)
    torch.cuda.synchronize()
    weights = int(torch.cuda.memory_allocated(0))
    probe = nbhw.plan(model_path, device_map=0, max_memory={0: 2 * weights + 4 * 2**30}, batch=2)
    share = next(d for d in probe.placement.devices if d.device == "cuda:0")  # type: ignore[union-attr]
    budget = weights + int(share.reserve_bytes or 0) + int(spare)
    plan = nbhw.plan(
        model_path, device_map=0, max_memory={0: budget}, batch=2, context=model.config.max_position_embeddings
    )
    tokens = int(plan.max_context or 0)
    found: dict[str, Any] = {
        "budget": budget,
        "weights": weights,
        "max_context": tokens,
        "verdict": plan.placement.verdict,
    }  # type: ignore[union-attr]
    if tokens < 2:
        return found
    at = nbhw.plan(model_path, device_map=0, max_memory={0: budget}, batch=2, context=tokens)
    share = next(d for d in at.placement.devices if d.device == "cuda:0")  # type: ignore[union-attr]
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((budget - int(share.reserve_bytes or 0)) / total, 0)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(0)
    ids = torch.randint(0, model.config.vocab_size, (2, tokens - 1), device="cuda:0")
    mask = torch.ones_like(ids)
    mask[1, 0] = 0  # left-padded: the second prompt one token shorter
    try:
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=1, min_new_tokens=1, do_sample=False)
        torch.cuda.synchronize()
        found["out_of_memory"] = None
    except torch.OutOfMemoryError as exc:
        found["out_of_memory"] = str(exc).splitlines()[0]
    found.update({
        "run_kind": at.placement.run_kind, "planned_peak": share.peak_bytes, "margin": share.margin_bytes,  # type: ignore[union-attr]
        "headroom": share.headroom_bytes, "measured_peak": int(torch.cuda.max_memory_allocated(0)),
        "measured_reserved": int(torch.cuda.max_memory_reserved(0)),
    })  # fmt: skip
    return found


def offline_kernels_facts(model_path: str) -> dict[str, Any]:
    """With the Hub offline and Hub kernels left at transformers' default: what the plan says, then the cell run."""
    import nbhw

    plan = nbhw.plan(model_path)
    found: dict[str, Any] = {"use_kernels": plan.use_kernels, "problems": plan.check(), "code": plan.code}
    found["problems_without_kernels"] = nbhw.plan(model_path, use_kernels=False).check()
    try:
        exec(compile(plan.code, "<plan.code>", "exec"), {})  # the user's cell, as nbhw wrote it
        found["load_error"] = None
    except Exception as exc:  # what the user would see
        found["load_error"] = f"{type(exc).__name__}: {exc}"
    return found


def serve_facts(model_path: str, context: str) -> dict[str, Any]:
    """nbhw's serving plan on cuda:0 (nothing allocated), then the model loaded there and the manager
    init_continuous_batching makes with the plan's config started for real: its paged cache and decisions."""
    import torch
    from transformers import AutoModelForCausalLM, ContinuousBatchingConfig
    from transformers.generation.continuous_batching import cache as cb_cache

    import nbhw

    plan = nbhw.plan(model_path, task="serve", context=int(context))
    made: list[Any] = []
    original = cb_cache.PagedAttentionCache.__init__

    def init(cache: Any, *args: Any, **kwargs: Any) -> None:
        original(cache, *args, **kwargs)
        made.append(cache)

    cb_cache.PagedAttentionCache.__init__ = init  # type: ignore[method-assign]
    model = AutoModelForCausalLM.from_pretrained(model_path, device_map=0)
    keywords = {k: eval(v) for k, v in plan.cb_keywords}  # the cell's literals
    manager = model.init_continuous_batching(continuous_batching_config=ContinuousBatchingConfig(**keywords))
    manager.start()
    manager.add_requests([[1, 2, 3]], max_new_tokens=2)
    manager.get_result(timeout=120)
    manager.stop(block=True)
    real, config = made[-1], manager.continuous_batching_config
    ours = plan.paged
    return {
        "planned_sectors": ours.sectors if ours else None, "real_sectors": int(real.num_sectors),
        "planned_cache_bytes": ours.cache_bytes if ours else None, "real_cache_bytes": int(real.cache_tensor.numel()),
        "bytes_per_sector": [ours.bytes_per_sector if ours else None, int(real.bytes_per_sector)],
        "planned_graphs": list(plan.config.cuda_graph_booleans) if plan.config else None,
        "real_graphs": list(config.cuda_graph_booleans),
        "planned_async": plan.config.use_async_batching if plan.config else None,
        "real_async": bool(config.use_async_batching),
        "planned_percent": plan.config.max_memory_percent if plan.config else None,
        "real_percent": config.max_memory_percent, "problem": plan.problem,
        "device": plan.device_name, "held_planned": plan.device.held,
        "allocated_after_load": int(torch.cuda.memory_allocated(0)),
    }  # fmt: skip


CHECKS = {
    "preflight": lambda args: preflight_facts(),
    "context": lambda args: context(args[0], args[1] if len(args) > 1 else None),
    "detect": lambda args: detect_facts(),
    "visible": lambda args: visible_facts(),
    "load": lambda args: load_facts(args[0] if args else None),
    "generate": lambda args: generate_facts(args[0], args[1]),
    "tight": lambda args: tight_facts(args[0], args[1]),
    "offline_kernels": lambda args: offline_kernels_facts(args[0]),
    "serve": lambda args: serve_facts(args[0], args[1]),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in CHECKS:
        print(f"usage: python -m tests.gpu.probe {{{','.join(CHECKS)}}} [ARG]", file=sys.stderr)
        return 2
    result = CHECKS[argv[0]](argv[1:])
    sys.stdout.flush()
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
