"""``nbhw.plan(model, task="serve")``: what continuous batching will hold on one device, here or on a target.

The weights and the framework's reserve on the serving device are the load plan's (:mod:`nbhw.core.plan`: the
same placement, the same reserve); the rest is the installed transformers' own answer (:mod:`nbhw.core.serve.paged`):
the resolved ``ContinuousBatchingConfig`` (CUDA graphs, asynchronous batching, ``max_memory_percent``), the paged
cache it makes with the memory left, and how many requests of a length its allocators hold at once.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbhw.core import render
from nbhw.core.argument import signature
from nbhw.core.errors import UserError
from nbhw.core.hf import tensor_parallel
from nbhw.core.plan import codegen, run_plan, run_search
from nbhw.core.plan.load_plan import LoadPlan, plan
from nbhw.core.plan.placement import DeviceShare, live_memory
from nbhw.core.render import py_literal, py_str
from nbhw.core.serve import paged
from nbhw.core.serve.arguments import SERVE_ARGUMENTS, ServeArgs, serve_args

if TYPE_CHECKING:
    from transformers import ContinuousBatchingConfig

# The scheduler is simulated request by request, step by step: past this many request-steps (a few seconds) the
# plan says it did not simulate, instead of keeping the user waiting.
MOST_STEPS = 2_000_000
GRAPH_BACKENDS = ("cuda", "rocm", "xpu")  # backends whose torch device module has graphs (DEVICE_TYPE_TO_GRAPH_NAME)
TRANSFORMERS_KIND = {"rocm": "cuda"}  # how transformers names the device (torch.device) of a backend


@dataclass(frozen=True)
class Requests:
    """How many requests of one length the cache holds at once, and (for a prompt / answer split) how many the
    scheduler runs at once."""

    length: int
    held: int
    together: paged.Together | None = None


@dataclass(frozen=True)
class Parallel:
    """Tensor-parallel serving as planned: the ranks (one device each), why that many, and what one rank holds of
    the weights under transformers' own TP sharding (None: one device holds them all)."""

    ranks: paged.Ranks = field(default_factory=paged.Ranks)
    why: str = ""
    rank_weights: int | None = None
    whole_weights: int | None = None

    @property
    def size(self) -> int:
        return self.ranks.size


@dataclass
class ServePlan(render.Shown):
    """The serving plan: the device, the resolved continuous batching config, the paged cache and the requests."""

    model: str
    args: ServeArgs
    load: LoadPlan
    device: paged.Device
    device_name: str
    memory_source: str
    paged: paged.Paged | None
    problem: str | None
    full: Requests | None
    typical: Requests | None
    longest: int | None
    parallel: Parallel = field(default_factory=Parallel)

    # ------------------------------------------------------------ what transformers decided

    @property
    def config(self) -> ContinuousBatchingConfig | None:
        return self.paged.config if self.paged is not None else None

    @property
    def attention(self) -> str:
        """The attention implementation continuous batching runs (transformers serves eager as paged|eager)."""
        return served_attention(self.load)

    def graphs_why(self) -> str:
        """CUDA graphs and asynchronous batching, as transformers' decide_use_cuda_graphs / decide_use_async_batching
        decided them for this attention on this device."""
        config = self.config
        if config is None:
            return "unknown: the cache could not be made"
        varlen, decode = config.cuda_graph_booleans
        graphs = "on" if varlen or decode else "off"
        compiled = [c.mode for c in (config.varlen_compile_config, config.decode_compile_config) if c is not None]
        if not self.device.graphs:
            why = f"{self.device.kind} has no CUDA-graph-like objects"
        elif compiled and not (varlen or decode) and self.attention.startswith("flash"):
            why = f"the compile mode ({', '.join(sorted(set(compiled)))}) makes its own graphs"
        elif self.attention.startswith("flash"):
            why = f"{self.attention} needs no attention mask"
        else:
            why = f"{self.attention} needs an attention mask (padding would cost it more than graphs save)"
        both = f" (prefill {'on' if varlen else 'off'}, decode {'on' if decode else 'off'})" if varlen != decode else ""
        sync = "on" if config.use_async_batching else "off"
        compile_words = f"; compiled: {', '.join(sorted(set(compiled)))}" if compiled else ""
        return f"CUDA graphs {graphs}{both}, async batching {sync}: {why}{compile_words}"

    def percent_why(self) -> str:
        if self.args.memory_percent is not None:
            return f"{self.args.memory_percent:g}: yours"
        percent = self.config.max_memory_percent if self.config is not None else None
        if percent is None:
            return "unknown"
        if self.device.kind in ("cpu", "mps"):
            return f"{percent:g}: transformers' choice on {self.device.kind} (RAM is shared with the system)"
        return f"{percent:g}: transformers' choice (0.8 when the generation config asks for logit processing)"

    # ------------------------------------------------------------ the cell and the command

    @property
    def cb_keywords(self) -> list[tuple[str, str]]:
        found = [("max_memory_percent", self.args.memory_percent), ("page_size", self.args.page_size),
                 ("max_batch_tokens", self.args.max_batch_tokens),
                 ("default_compile_level", self.args.compile_level)]  # fmt: skip
        return [(k, repr(v) if isinstance(v, float) else py_literal(v)) for k, v in found if v is not None]

    @property
    def code(self) -> str:
        """The cell: from_pretrained as the load plan writes it, then a continuous batching manager made with the
        config (``init_continuous_batching``: what a server makes, sized without a workload's hints, as planned) fed
        as many full-length requests as fit."""
        load, ranks = self.load, self.parallel.size
        # device_memory says what the device has: it bounds nothing from_pretrained places (no max_memory); under
        # tensor parallelism each process takes its own device (no device_map)
        dropped = ("max_memory", "device_map") if ranks > 1 else ("max_memory",)
        kwargs = [(k, v) for k, v in load.arguments.kwargs if k not in dropped]
        tp = ["DistributedConfig"] if ranks > 1 else []
        if ranks > 1:
            kwargs.append(("distributed_config", 'DistributedConfig(tp_plan="auto")'))
        call = codegen.assignment("model", f"{load.inputs.auto_class}.from_pretrained", "model_id", kwargs)
        names = sorted({load.inputs.auto_class, "AutoTokenizer", "ContinuousBatchingConfig", "GenerationConfig", *tp,
                        *load.arguments.names})  # fmt: skip
        launch = [f"# serve.py, run as: {self.torchrun} (one process per device)"] if ranks > 1 else []
        wait = " if manager.is_tp_driver else []" if ranks > 1 else ""  # the driver rank gets the results
        answer = self.args.answer or max(self.load.context // 2, 1)
        cb = ", ".join(f"{k}={v}" for k, v in self.cb_keywords)
        lines = [
            *launch,
            *(["import torch"] if load.arguments.needs_torch else []),
            f"from transformers import {', '.join(names)}", *load.arguments.imports, "",
            f"model_id = {py_str(self.model)}", "tokenizer = AutoTokenizer.from_pretrained(model_id)", call, "",
            f"cb_config = ContinuousBatchingConfig({cb})",
            "manager = model.init_continuous_batching(",
            f"    generation_config=GenerationConfig(max_new_tokens={answer}), continuous_batching_config=cb_config",
            ")",
            "manager.start()",
            f"prompts = [\"Hello, my name is\"] * {self.requests_in_cell}",
            "manager.add_requests([tokenizer(p)[\"input_ids\"] for p in prompts])",
            f"results = [manager.get_result(timeout=600) for _ in prompts]{wait}",
            "manager.stop(block=True)",
        ]  # fmt: skip
        source = "\n".join(lines) + "\n"
        ast.parse(source)
        return source

    @property
    def requests_in_cell(self) -> int:
        """As many requests as fit: of the typical split when one is given, else at full length."""
        found = self.typical or self.full
        return max(found.held if found is not None else 1, 1)

    def decode_path_words(self) -> str | None:
        """The decode fast path (flash attention's block tables) as resolved here, when it may differ on the card."""
        if self.config is None or not self.device.graphs or not self.attention.startswith("flash"):
            return None
        state = "on" if self.config.max_blocks_per_request else "off"
        return (f"{state} as resolved here; on the card transformers turns it on when flash_attn_with_kvcache "
                "imports, and its block tables then take a little of the cache (unknown here)")  # fmt: skip

    @property
    def torchrun(self) -> str:
        return f"torchrun --nproc_per_node={self.parallel.size} serve.py"

    @property
    def command(self) -> str:
        """The same setup as ``transformers serve --continuous-batching`` (the flags its installed CLI takes); under
        tensor parallelism, the cell launched by torchrun when the installed CLI takes no tensor-parallel flag."""
        from transformers.cli.serve import Serve  # lazy: import nbhw and %load_ext nbhw stay free of transformers

        takes = set(inspect.signature(Serve.__init__).parameters)
        if self.parallel.size > 1 and not any(name.startswith("tp_") or "parallel" in name for name in takes):
            return f"{self.torchrun}  # the cell above; transformers serve takes no tensor-parallel flag"
        flags = ["--continuous-batching", f"--force-model {self.model}"]
        wanted = {"attn_implementation": self.load.args.attn_implementation, "dtype": self.args.dtype,
                  "cb_max_memory_percent": self.args.memory_percent, "cb_block_size": self.args.page_size,
                  "cb_max_batch_tokens": self.args.max_batch_tokens}  # fmt: skip
        flags += [f"--{k.replace('_', '-')} {v}" for k, v in wanted.items() if v is not None and k in takes]
        if self.args.compile_level and "compile" in takes:
            flags.append("--compile")
        return "transformers serve " + " ".join(flags)

    # ------------------------------------------------------------ shown

    def rows(self) -> list[tuple[str, str]]:
        size = render.size
        found = self.paged
        out = [("device", f"{self.device_name}: {size(self.device.total)} ({self.memory_source})"),
               ("weights + reserve", f"{size(self.device.held)} held before the cache")]  # fmt: skip
        tp = self.parallel
        if tp.size > 1 and tp.rank_weights is not None:
            out[1] = (
                "weights + reserve",
                f"{size(self.device.held)} held on each rank before the cache: "
                f"{size(tp.rank_weights)} of the {size(tp.whole_weights or 0)} weights (rank 0's share)",
            )
            out.insert(1, ("tensor parallel", f"{tp.size} ranks, tp_plan='auto' ({tp.why}): each holds the same "
                           f"pages for 1/{tp.size} of the key/value heads; transformers sizes every rank's cache "
                           "by the smallest, and rank 0 holds the most weights"))  # fmt: skip
        elif tp.why:
            out.insert(1, ("cards", tp.why))
        if found is None:
            return [*out, ("cache", f"none: {self.problem}")]
        pools = "; ".join(
            f"{p.attention} ({p.layers} layers, {p.tokens_per_page} tokens per page"
            + (f", window {p.window:,}" if p.window else "")
            + ")"
            for p in found.pools
        )
        out += [
            ("max_memory_percent", self.percent_why()),
            ("for the cache", f"{size(found.available)}: (memory - weights - reserve) x max_memory_percent"),
            ("paged cache", f"{size(found.cache_bytes)}: {found.sectors:,} sectors of {size(found.bytes_per_sector)}"
             f" ({found.tokens_per_sector:,} tokens each), {found.blocks:,} blocks of "
             f"{found.config.page_size} tokens x every layer = {found.blocks * found.config.page_size:,} tokens"),
            ("page pools", pools),
            ("batch buffer", f"max_batch_tokens {found.max_batch_tokens:,}: {size(found.batch_bytes)} (inputs, "
             f"outputs, the activation peak), masks {size(found.mask_bytes)}, fixed {size(found.fixed_bytes)}"),
            ("graphs", self.graphs_why()),
        ]  # fmt: skip
        decode = self.decode_path_words()
        if decode is not None:
            out.append(("decode fast path", decode))
        if self.full is not None:
            out.append(("requests", f"{self.full.held:,} at once of {self.full.length:,} tokens (full length)"))
        if self.typical is not None:
            out.append(("typical", f"{self.typical.held:,} at once of {self.typical.length:,} tokens "
                        f"({self.args.prompt:,} prompt + {self.args.answer:,} answer)"))  # fmt: skip
            out.append(("scheduled together", self.together_words()))
        if self.longest is not None:
            out.append(("longest request", f"{self.longest:,} tokens (one request alone)"))
        return out

    def together_words(self) -> str:
        """What the scheduler did with those requests, sent all at once (transformers' own scheduler, simulated)."""
        seen = self.typical.together if self.typical is not None else None
        margin = self.safety_margin()
        if seen is None and self.typical is not None:
            return (f"not simulated ({self.typical.held + 1:,} requests x {self.args.answer:,} steps is over "
                    f"{MOST_STEPS:,}): at most the {self.typical.held:,} the cache holds")  # fmt: skip
        if seen is None or margin is None:
            return "unknown"
        held = self.typical.held if self.typical is not None else 0
        kind = self.paged.config.scheduler_type if self.paged is not None else "its"
        why = (f"the {kind} scheduler admits a prompt only while {margin:.0%} of the cache is free"
               if seen.most_active < held else "as many as the cache holds")  # fmt: skip
        if seen.starved:
            return (f"{seen.most_active:,} start at once (a prompt is admitted by its own size), and as their answers "
                    f"grow the cache holds {held:,}: the scheduler offloads the others to wait")  # fmt: skip
        return f"{seen.most_active:,} run at once, the next waits ({why})"

    def safety_margin(self) -> float | None:
        """The scheduler's safety margin: the share of the cache that must be free to admit a new prompt."""
        from transformers.generation.continuous_batching.scheduler import SCHEDULER_MAPPING  # lazy: transformers

        if self.paged is None:
            return None
        config = self.paged.config
        return float(SCHEDULER_MAPPING[config.scheduler_type](self.paged.cache, config.safety_margin, 1).safety_margin)

    def headline(self) -> str:
        if self.full is None:
            return f"nbhw serve: {self.model}: no paged cache ({self.problem})"
        return (f"nbhw serve: {self.model} on {self.device_name}: {self.full.held:,} requests of "
                f"{self.full.length:,} tokens at once")  # fmt: skip

    def text(self) -> str:
        lines = [self.headline(), "", *render.field_lines(self.rows()), "", "Code"]
        lines += ["    " + line if line else "" for line in self.code.splitlines()]
        lines += ["", "Command", "    " + self.command]
        return "\n".join(lines) + "\n"

    def html(self) -> str:
        esc = render.esc
        table = render.html_table(("", ""), [list(r) for r in self.rows()])
        return (f'<div class="nbhw-serve"><p><b>{esc(self.headline())}</b></p>{table}'
                f'<pre class="nbhw-code">{esc(self.code)}</pre><pre>{esc(self.command)}</pre></div>')  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        found = self.paged
        cache = None
        if found is not None:
            cache = {"sectors": found.sectors, "bytes_per_sector": found.bytes_per_sector,
                     "tokens_per_sector": found.tokens_per_sector, "bytes": found.cache_bytes,
                     "blocks": found.blocks, "page_size": found.config.page_size,
                     "tokens": found.blocks * found.config.page_size, "available_bytes": found.available,
                     "max_batch_tokens": found.max_batch_tokens, "batch_bytes": found.batch_bytes,
                     "mask_bytes": found.mask_bytes, "fixed_bytes": found.fixed_bytes,
                     "pools": [asdict(p) for p in found.pools],
                     "max_memory_percent": found.config.max_memory_percent,
                     "cuda_graphs": list(found.config.cuda_graph_booleans),
                     "async_batching": found.config.use_async_batching}  # fmt: skip
        return {"model": self.model, "task": "serve", "device": self.device_name, "device_bytes": self.device.total,
                "held_bytes": self.device.held, "attention": self.attention, "cache": cache, "problem": self.problem,
                "requests": None if self.full is None else asdict(self.full),
                "typical": None if self.typical is None else asdict(self.typical), "longest": self.longest,
                "tp_size": self.parallel.size, "rank_weight_bytes": self.parallel.rank_weights,
                "code": self.code, "command": self.command}  # fmt: skip


# ---------------------------------------------------------------- the plan


def _load_plan(model: str | Path | None, args: ServeArgs, offline: bool) -> LoadPlan:
    """The load plan of the serving device: a target's first card, else this machine's first accelerator, else its
    CPU (``device_memory``: that device's memory, instead of what is free there now)."""
    values: dict[str, Any] = {"dtype": args.dtype, "context": args.context, "reserve": args.reserve,
                              "attn_implementation": args.attn_implementation, "target": args.target}  # fmt: skip
    on_cpu = args.target is None and live_memory().accelerator is None  # what a plan here reads as its device
    device: int | str = "cpu" if on_cpu else 0
    if args.device_memory is not None:
        values["max_memory"] = {device: args.device_memory}
    return plan(model, offline=offline, device_map=device, **values)


def _parallel(load: LoadPlan, args: ServeArgs) -> Parallel:
    """How many tensor-parallel ranks: ``tp_size``, else every card of a target whose heads split over them (else
    one, saying why); and what rank 0 holds of the weights under transformers' own sharding, on meta."""
    cards = args.target.count if args.target is not None else 1
    size, why = args.tp_size, "yours"
    if size is None and cards > 1:
        problems = tensor_parallel.tp_problems(load.config.config, cards) if load.config.available else ["unknown"]
        if problems:
            return Parallel(why=f"one of the {cards}: the figures are one card's; tensor parallelism across them: "
                            f"{problems[0]}")  # fmt: skip
        size, why = cards, "every card of the target; tp_size=1 plans one"
    if size is None or size == 1:
        return Parallel(why=f"one of the {cards}: tp_size 1" if cards > 1 else "")
    _check_ranks_here(load, args, size)
    ranks, weights = _sharded(load, size)
    placement = load.weight_placement
    whole = placement.devices[0].bytes if placement is not None and placement.devices else None
    return Parallel(ranks, why, weights, whole)


def _sharded(load: LoadPlan, size: int) -> tuple[paged.Ranks, int]:
    """The model sharded over ``size`` ranks by its own TP plan (on meta, in a fake world): the ranks with that
    plan, and the bytes of weights rank 0 holds; a model or a size transformers' rules refuse is a UserError."""
    config, model = load.config.config if load.config.available else None, load.meta_model
    if config is None or model is None:
        raise UserError(f"serve: tp_size {size} needs the model's config to shard; it is not available")
    problems = tensor_parallel.tp_problems(config, size)
    if problems:
        raise UserError(f"serve: {problems[0]}")
    if getattr(config, "quantization_config", None) is not None:
        raise UserError("serve: tensor-parallel serving of a pre-quantized checkpoint is not planned; tp_size 1")
    try:
        with tensor_parallel.fake_world(size):
            sharded = tensor_parallel.tp_sharded(config, model.dtype, size)
            plan = tuple(sorted(dict(getattr(sharded, "tp_plan", None) or {}).items()))
            return paged.Ranks(size, plan), tensor_parallel.rank_bytes(sharded)
    except RuntimeError as exc:  # a real process group is up here (inside torchrun): the fake one can't be made
        raise UserError(f"serve: tp_size {size} is planned in a process without a process group: {exc}") from None


def _check_ranks_here(load: LoadPlan, args: ServeArgs, size: int) -> None:
    """``tp_size`` on this machine needs as many accelerators (device_memory names each rank's device instead)."""
    if args.target is not None or args.device_memory is not None:
        return
    here = sum(1 for key in load.placed.live.max_memory if isinstance(key, int))
    if here < size:
        raise UserError(f"tp_size {size} needs {size} devices; this machine has {here} accelerator(s); valid: 1"
                        f"{f' to {here}' if here > 1 else ''}, or a target (e.g. target='{size}x H100') or "
                        "device_memory (each rank's device)")  # fmt: skip


def _device(load: LoadPlan, args: ServeArgs, parallel: Parallel) -> tuple[paged.Device, str, str]:
    placement = load.weight_placement
    sharded = parallel.rank_weights is not None
    if placement is None or placement.kind == "none" or (placement.kind == "too_big" and not sharded):
        why = placement.verdict if placement is not None else "no placement (the config is not available)"
        raise UserError(f"serve: the weights do not fit the device: {why}")
    share = placement.devices[0]
    if parallel.rank_weights is not None:
        return _rank_device(load, args, parallel, share, placement.budget_source)
    if (
        run_plan.backend_of(share.key, load.inputs, load.placed.live) == "cpu"
        and args.device_memory is None
        and _cpu_only_torch()
    ):
        return _this_cpu(share.bytes), share.device, "this machine's RAM as transformers reads it (total, this RSS)"
    device = _card(load, share, share.bytes)
    given = args.device_memory is not None  # passed to the load plan as its max_memory, but the user said device_memory
    return device, share.device, "the device_memory you gave" if given else placement.budget_source


def _card(load: LoadPlan, share: DeviceShare, weights: int) -> paged.Device:
    """The serving device of ``share`` as transformers will read it: its budget, and ``weights`` with the framework's
    reserve held on it before the cache."""
    backend = run_plan.backend_of(share.key, load.inputs, load.placed.live)
    reserve = run_plan.reserve(share.key, load.inputs, load.placed.live)
    total = share.budget if share.budget is not None else 0
    held = weights + (reserve.bytes if reserve else 0)
    return paged.Device(TRANSFORMERS_KIND.get(backend, backend), total, held, backend in GRAPH_BACKENDS)


def _rank_device(
    load: LoadPlan, args: ServeArgs, parallel: Parallel, share: DeviceShare, source: str
) -> tuple[paged.Device, str, str]:
    """Rank 0's device under tensor parallelism: one card's memory, its share of the weights and the reserve."""
    weights = parallel.rank_weights or 0
    device = _card(load, share, weights)
    if device.held >= device.total:
        raise UserError(f"serve: the weights do not fit: each of the {parallel.size} ranks holds "
                        f"{render.size(weights)} of them and the reserve, {render.size(device.total)} per device; a "
                        "larger tp_size or a bigger card")  # fmt: skip
    name = f"{parallel.size} ranks like {share.device} (tensor parallel)"
    return device, name, "the device_memory you gave, each rank's" if args.device_memory is not None else source


def _cpu_only_torch() -> bool:
    """A torch built without CUDA or ROCm: transformers' memory probe then reads psutil only (with one, it would ask
    the GPU runtime first, which nbhw never starts)."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    return torch.version.cuda is None and getattr(torch.version, "hip", None) is None


def _this_cpu(weights: int) -> paged.Device:
    """Serving on this machine's CPU: transformers reads the RAM's total and this process's RSS (its own
    get_device_and_memory_breakdown, asked now: on the CPU it reads psutil, nothing else), and the weights add to
    the RSS once loaded."""
    from transformers.generation.continuous_batching.utils import get_device_and_memory_breakdown

    _, total, reserved, allocated = get_device_and_memory_breakdown()
    return paged.Device("cpu", int(total), int(max(reserved, allocated)) + weights, False)


def _cb_config(args: ServeArgs) -> Any:
    from transformers import ContinuousBatchingConfig  # lazy: import nbhw and %load_ext nbhw stay free of it

    given = {"max_memory_percent": args.memory_percent, "page_size": args.page_size,
             "max_batch_tokens": args.max_batch_tokens, "default_compile_level": args.compile_level}  # fmt: skip
    return ContinuousBatchingConfig(**{k: v for k, v in given.items() if v is not None})


def served_attention(load: LoadPlan) -> str:
    """The attention implementation continuous batching runs: the one asked (else the model's default), eager as
    paged|eager (transformers' switch_to_cb_friendly_attn)."""
    model = load.meta_model
    default = str(getattr(model.config, "_attn_implementation", None) or "sdpa") if model is not None else "sdpa"
    asked = load.args.attn_implementation or default
    return "paged|eager" if asked == "eager" else asked


def _made(
    load: LoadPlan, args: ServeArgs, device: paged.Device, ranks: paged.Ranks
) -> tuple[paged.Paged | None, str | None]:
    """transformers' resolved config and paged cache (a refusal of a value is a UserError; no room is a problem)."""
    model, served = load.meta_model, served_attention(load)
    if model is None:
        return None, "no meta model (the config is not available or transformers refused it)"
    try:
        config = paged.resolved(model, _cb_config(args), device, served)
    except ValueError as exc:
        raise UserError(f"serve: transformers refuses the continuous batching config: {exc}") from None
    except (AttributeError, ImportError, TypeError) as exc:  # another release's continuous batching
        return None, f"unknown: this transformers' continuous batching is not the one nbhw reads ({exc!r})"
    try:
        return paged.paged(model, config, device, served, ranks), None
    except (AttributeError, ImportError, TypeError) as exc:
        return None, f"unknown: this transformers' paged cache is not the one nbhw reads ({exc!r})"
    except (ValueError, MemoryError) as exc:
        why = " ".join(str(exc).split())
        return None, (f"transformers can't make the cache in what the weights leave: {why} (a smaller "
                      "max_batch_tokens, or more memory)")  # fmt: skip


def serve_plan(model: str | Path | None = None, *, offline: bool = False, **values: Any) -> ServePlan:
    """What ``generate_batch`` / ``transformers serve --continuous-batching`` will hold for ``model``: the paged cache
    transformers makes with the memory the weights leave, and how many requests of ``context`` tokens fit at once.

    >>> nbhw.plan("Qwen/Qwen3-8B", task="serve", target="L4", context="8k", prompt=512, answer=256)  # doctest: +SKIP
    """
    args = serve_args(**values)
    load = _load_plan(model, args, offline)
    parallel = _parallel(load, args)
    device, name, source = _device(load, args, parallel)
    found, problem = _made(load, args, device, parallel.ranks)
    full = typical = longest = None
    if found is not None:
        full = Requests(load.context, paged.requests_held(found, load.context))
        if args.prompt is not None and args.answer is not None:
            length = args.prompt + args.answer
            held = paged.requests_held(found, length)
            steps = (held + 1) * (args.answer + args.prompt // max(found.max_batch_tokens, 1) + 1)
            together = paged.most_together(found, args.prompt, args.answer, held) if steps <= MOST_STEPS else None
            typical = Requests(length, held, together)
        limit = run_search.context_limit(load.config.config) if load.config.available else load.context
        longest = paged.longest_request(found, min(limit, run_search.NO_LIMIT))
    return ServePlan(load.model, args, load, device, name, source, found, problem, full, typical, longest, parallel)


serve_plan.__signature__ = signature(serve_plan, SERVE_ARGUMENTS, keep=("model", "offline"))  # type: ignore[attr-defined]
