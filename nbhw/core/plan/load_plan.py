"""``nbhw.plan()``: the from_pretrained cell for a model, its dry run, memory estimate and placement.

Nothing here downloads weights or kernels, and nothing creates a CUDA context: the model is built on the meta
device through transformers' own ``__init__`` (see :mod:`nbhw.core.hf.meta_build`), free memory comes from nbhw's
probes, and the config comes from a local folder, the HF cache, or (only when online and allowed) the Hub.
"""

from __future__ import annotations

import copy
import re
from functools import cached_property
from pathlib import Path
from typing import Any

from nbhw.core import argument, render
from nbhw.core.advice.quantization_methods import build_config, method_key
from nbhw.core.cache import Recent
from nbhw.core.hardware import backends, presence
from nbhw.core.hardware.data import BackendStatus
from nbhw.core.hardware.targets import Target, target_of
from nbhw.core.hardware.who_picks import from_pretrained_default
from nbhw.core.hf import meta_build, model_config
from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.plan import codegen, estimate, for_target
from nbhw.core.plan.arguments import DISK, PLAN_ARGUMENTS, PlanArgs, plan_args
from nbhw.core.plan.estimate import Estimate
from nbhw.core.plan.placement import LiveMemory, Placement, live_memory, place
from nbhw.core.plan.preflight import warnings as preflight_warnings
from nbhw.core.plan.quantized_sizes import PlanningQuantizer
from nbhw.core.render import Shown

BUILD_CACHE_SIZE = 6
_BUILDS: Recent[meta_build.MetaBuild] = Recent(BUILD_CACHE_SIZE)
FALLBACK_AUTO_CLASS = "AutoModelForCausalLM"


def _config_key(config: Any) -> str:
    return f"{type(config).__name__}:{config.to_json_string(use_diff=False)}"


def cached_build(config: Any, auto_name: str, dtype: str, attn: str | None) -> meta_build.MetaBuild:
    """A meta build, shared by every plan with the same config, class, dtype and attention (the model is read-only)."""
    key = (_config_key(config), auto_name, dtype, attn)
    return _BUILDS.get(
        key, lambda: meta_build.build(config, dtype=dtype, attn_implementation=attn, auto_name=auto_name)
    )


def clear_cache() -> None:
    """Forget the cached meta builds."""
    _BUILDS.clear()


def _weights_file(model: str, source: str | None) -> str | None:
    """The first weights file transformers would read for dtype="auto", if it is on this machine."""
    names = ("model.safetensors", "pytorch_model.bin")
    if source == model_config.LOCAL:
        folder = Path(model).expanduser()
        for name in names:
            if (folder / name).is_file():
                return str(folder / name)
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            import json

            shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
            return str(folder / shards[0]) if shards and (folder / shards[0]).is_file() else None
        return None
    if source == model_config.CACHE:
        from huggingface_hub import try_to_load_from_cache

        for name in names:
            found = try_to_load_from_cache(model, name)
            if isinstance(found, str):
                return found
    return None


def weights_dtype(model: str, source: str | None) -> str | None:
    """The dtype transformers reads from the weights' header when the config names none (no tensor data read)."""
    path = _weights_file(model, source)
    if path is None:
        return None
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.modeling_utils import get_state_dict_dtype, load_state_dict

    try:
        state = load_state_dict(path, map_location="meta", weights_only=True)
    except Exception:
        return None
    return str(get_state_dict_dtype(state)).removeprefix("torch.")


class LoadPlan(Shown):
    """A from_pretrained plan: ``.code``, ``.check()``, ``.estimate``, ``.placement``; renders as a report.

    Properties are computed on first use and kept: ``.placement`` reads free memory at that moment.
    """

    def __init__(self, model: str, args: PlanArgs, *, offline: bool = False) -> None:
        self.model = model
        self.args = args
        self.offline = offline
        self._problems: list[str] | None = None

    def __repr__(self) -> str:
        return f"LoadPlan(model={self.model!r}, {self.args})"

    # ------------------------------------------------------------ inputs

    @cached_property
    def config(self) -> model_config.ModelConfig:
        """The model's config and where it came from (local folder, HF cache, Hub config.json)."""
        with meta_build.quiet():
            return model_config.load(self.model, offline=self.offline)

    @cached_property
    def auto_class(self) -> str:
        """The Auto class for this architecture (AutoModelForCausalLM when the config is not available)."""
        if not self.config.available:
            return FALLBACK_AUTO_CLASS
        return meta_build.auto_class_name(self.config.config)

    @cached_property
    def config_dtype(self) -> str | None:
        """The dtype the config names (what dtype="auto" picks), if any."""
        if not self.config.available:
            return None
        value = getattr(self.config.config, "dtype", None)
        return None if value is None else str(value).removeprefix("torch.")

    @cached_property
    def dtype(self) -> str:
        """The dtype the weights will have: yours, else the config's, else the weights', else float32."""
        if self.args.dtype != "auto":
            return self.args.dtype
        return self.config_dtype or weights_dtype(self.model, self.config.source) or "float32"

    @cached_property
    def target(self) -> Target | None:
        """The catalog target the plan is for (hardware that is not here), or None for this machine."""
        return target_of(self.args.target)

    @cached_property
    def _rows(self) -> list[BackendStatus]:
        # A target's rows are the ones detection would give on it: its memory is the budget (see for_target).
        return self.target.rows() if self.target is not None else backends.probe_all()

    @cached_property
    def default_device(self) -> str:
        """Where from_pretrained puts the model without a device_map (cpu, unless a torch default device is set)."""
        return from_pretrained_default().device

    # ------------------------------------------------------------ code

    @cached_property
    def arguments(self) -> codegen.Arguments:
        """The keyword arguments the cell passes, and why the others are left out."""
        return codegen.call_arguments(self.args, config_dtype=self.config_dtype, default_device=self.default_device)

    @cached_property
    def code(self) -> str:
        """The cell a person would write: imports, tokenizer, from_pretrained, a short generation."""
        return codegen.cell(self.model, self.auto_class, self.arguments)

    # ------------------------------------------------------------ meta builds

    @cached_property
    def _attn_download(self) -> bool:
        return meta_build.needs_download(self.args.attn_implementation)

    @cached_property
    def _attn_on_target(self) -> bool:
        # A build here can't answer for flash attention or a Hub kernel on the target: the rules do (for_target).
        return self.target is not None and for_target.device_dependent(self.args.attn_implementation)

    @cached_property
    def build(self) -> meta_build.MetaBuild | None:
        """The meta build with your dtype and attn_implementation (None without a config or if it needs a download)."""
        if not self.config.available or self._attn_download or self._attn_on_target:
            return None
        return cached_build(self.config.config, self.auto_class, self.dtype, self.args.attn_implementation)

    @cached_property
    def meta_model(self) -> Any | None:
        """A meta-device model in the plan's dtype for sizes (built with default attention if yours was refused)."""
        if self.build is not None and self.build.ok:
            return self.build.model
        if not self.config.available:
            return None
        fallback = cached_build(self.config.config, self.auto_class, self.dtype, None)
        return fallback.model if fallback.ok else None

    @cached_property
    def quantizer(self) -> PlanningQuantizer | None:
        """The quantizer sizes are computed with, when quantization is asked for."""
        if self.args.quantization is None:
            return None
        device = self.target.device() if self.target is not None else None
        with meta_build.quiet():
            return PlanningQuantizer(self.args.quantization, self.dtype, device, self.args.device_map)

    # ------------------------------------------------------------ estimate and placement

    @cached_property
    def estimate(self) -> Estimate | None:
        """Parameters, bytes, largest layer, KV cache per 1,000 tokens, training; None without a config."""
        model = self.meta_model
        if model is None:
            return None
        with meta_build.quiet():
            result = estimate.estimate(
                model,
                self.config.config,
                self.dtype,
                quantizer=self.quantizer,
                quantization=self.args.quantization,
                generative=self.auto_class in meta_build.GENERATIVE,
            )
        method: Any = getattr(self.config.config, "quantization_config", None)
        if method is not None and self.args.quantization is None:
            method = method.get("quant_method") if isinstance(method, dict) else getattr(method, "quant_method", "?")
            result.notes.append(f"this checkpoint is pre-quantized ({method}): sizes are of the unquantized weights")
        return result

    @cached_property
    def live(self) -> LiveMemory:
        """The free memory device_map="auto" would fill here, read now (a target's: its catalog memory)."""
        found = live_memory(self._rows)
        if self.target is not None:
            found.source = f"the {self.target.label}'s memory (nbhw's catalog)"
        return found

    @cached_property
    def placement(self) -> Placement | None:
        """The device_map transformers would compute, per device, with a verdict; None without a config."""
        model = self.meta_model
        if model is None:
            return None
        found = place(model, self.args, quantizer=self.quantizer, default_device=self.default_device, live=self.live)
        return for_target.unlisted_budgets(found, self.target) if self.target is not None else found

    # ------------------------------------------------------------ dry run

    def check(self) -> list[str]:
        """Dry run: what transformers would refuse, one line each; [] means it accepts the plan here."""
        if self._problems is None:
            self._problems = self._check()
        return list(self._problems)

    def _check(self) -> list[str]:
        if not self.config.available:
            return [self.config.problem or f"config of {self.model!r} not available"]
        problems = self._kernel_problems()
        build = self.build
        if build is not None and not build.ok:
            problems.append(f"transformers refuses the model build: {build.error_type}: {build.error}")
        problems += self._quantization_problems() if self.target is None else self._target_problems()
        placement = self.placement
        if placement is not None:
            problems += placement.problems
            problems += self.quantizer.errors if self.quantizer is not None else []
            problems += self._device_problems(placement)
            if build is not None and build.ok:
                problems += self._flash_problems(placement)
            if self.target is not None:
                used = list(placement.device_map.values())
                problems += for_target.unused_devices(used, self.target, placement.strategy)
        return problems

    def _target_problems(self) -> list[str]:
        """What a build here can't answer for the target: its attention rules and its quantization checks."""
        assert self.target is not None
        found = for_target.attention_problems(
            self.model, self.args.attn_implementation, self.dtype, self.target, self.offline
        )
        quantization, _ = self._target_quantization
        return found + quantization

    @cached_property
    def _target_quantization(self) -> tuple[list[str], list[str]]:
        assert self.target is not None
        config = self.config.config
        return for_target.quantization_findings(
            self.args.quantization, config, self.args.device_map, self.dtype, self.target
        )

    def _kernel_problems(self) -> list[str]:
        if not self.args.use_kernels:
            return []
        ok, why = meta_build.kernels_status()
        return [] if ok else [f"use_kernels=True: {why}"]

    def _quantization_problems(self) -> list[str]:
        """transformers' quantizer checks: the one asked for, or the one a pre-quantized checkpoint names."""
        prequantized = getattr(self.config.config, "quantization_config", None) is not None
        if self.args.quantization is None and not prequantized:
            return []
        # lazy: import nbhw and %load_ext nbhw stay free of transformers
        from transformers.integrations.accelerate import check_and_set_device_map

        # lazy: import nbhw and %load_ext nbhw stay free of transformers
        from transformers.quantizers.auto import get_hf_quantizer

        asked = None
        if self.args.quantization is not None:
            asked, problem = build_config(method_key(self.args.quantization), self.dtype)
            if asked is None:
                return [f"quantization={self.args.quantization}: the config can't be built here: {problem}"]
        try:
            with meta_build.quiet():
                device_map = check_and_set_device_map(copy.deepcopy(self.args.device_map))
                get_hf_quantizer(copy.deepcopy(self.config.config), asked, device_map, True, {})
        except Exception as exc:
            what = f"quantization={self.args.quantization}" if asked is not None else "this pre-quantized checkpoint"
            return [f"{what}: {type(exc).__name__}: {' '.join(str(exc).split())}"]
        return []

    def _device_problems(self, placement: Placement) -> list[str]:
        return presence.absent(list(placement.device_map.values()), self._rows, self.live.accelerator)

    def _flash_problems(self, placement: Placement) -> list[str]:
        impl = (self.args.attn_implementation or "").removeprefix("paged|")
        m = re.fullmatch(r"flash_attention_(\d)", impl)
        if m is None or not meta_build.flash_package_installed(int(m.group(1))):
            return []
        # lazy: import nbhw and %load_ext nbhw stay free of transformers
        from transformers.modeling_flash_attention_utils import FLASH_ATTENTION_COMPATIBILITY_MATRIX

        entry = FLASH_ATTENTION_COMPATIBILITY_MATRIX.get(int(m.group(1)), {})
        supported = [name for _, name in entry.get("supported_devices", ())]
        used = {presence.device_type(v, self.live.accelerator) for v in placement.device_map.values() if v != DISK}
        off = sorted(t for t in used if t is not None and t not in supported)
        if not off:
            return []
        return [
            f"attn_implementation={impl!r} runs on {', '.join(supported)}; this plan puts layers on {', '.join(off)}"
        ]

    # ------------------------------------------------------------ notes and views

    @property
    def notes(self) -> list[str]:
        """What a reader should know that is not a problem: defaults left out, guesses, what was not checked."""
        return plan_notes(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data: arguments, code, problems, notes, estimate, placement."""
        return plan_to_dict(self)

    def text(self, *, code: bool = True) -> str:
        """The plan as text for terminals (``code=False`` leaves out the cell)."""
        return plan_text(self, code=code)

    def html(self, *, code: bool = True) -> str:
        """The plan as an HTML fragment."""
        return plan_html(self, code=code)

    def view(self, *, code: bool = True) -> PlanView:
        """A displayable report of this plan (``code=False``: without the cell, e.g. when it was just emitted)."""
        return PlanView(self, code=code)


class PlanView(Shown):
    """A plan's report with or without its code; renders as HTML in Jupyter and as text elsewhere."""

    def __init__(self, plan: LoadPlan, *, code: bool) -> None:
        self.plan = plan
        self.code = code

    def text(self) -> str:
        return self.plan.text(code=self.code)

    def html(self) -> str:
        return self.plan.html(code=self.code)


def from_words(args: Any) -> LoadPlan:
    """A plan from the parsed words of ``%hw load`` / ``python -m nbhw load`` (see nbhw.commands)."""
    return plan(args.model, offline=args.offline, **argument.given(args, PLAN_ARGUMENTS))


def plan(model: str | Path | None = None, *, offline: bool = False, **arguments: Any) -> LoadPlan:
    """Plan ``from_pretrained(model, ...)`` for this machine (or for the ``max_memory`` you name).

    ``model`` is a Hub id or a local folder; None plans nbhw's tiny local model. The other keywords are the
    arguments of :class:`~nbhw.core.plan.arguments.PlanArgs` (``dtype``, ``device_map``, ``attn_implementation``,
    ...). Mistakes raise a one-line :class:`~nbhw.core.errors.UserError` naming the valid values. Same words on
    the command line: ``python -m nbhw load MODEL --device-map auto --dtype bfloat16 --max-memory 0=70GiB``.

    >>> p = nbhw.plan("Qwen/Qwen3-0.6B", dtype="bfloat16")   # doctest: +SKIP
    >>> print(p.code); p.check(); p.estimate; p.placement     # doctest: +SKIP
    """
    name = str(tiny_model_path() if model is None else model)
    model_config.kind(name)  # a mistyped path or id is a UserError now, not a problem later
    return LoadPlan(name, plan_args(**arguments), offline=offline)


plan.__signature__ = argument.signature(plan, PLAN_ARGUMENTS, keep=("model", "offline"))  # type: ignore[attr-defined]


# ---------------------------------------------------------------- the plan as text, HTML and plain data


def count(n: int) -> str:
    """A parameter count as model cards write it: 8.03B, 596.0M, 112.5K."""
    for unit, scale, digits in (("B", 10**9, 2), ("M", 10**6, 1), ("K", 10**3, 1)):
        if n >= scale:
            return f"{n / scale:.{digits}f}{unit}"
    return str(n)


def _dtype_note(plan: LoadPlan) -> str | None:
    if plan.args.dtype != "auto":
        return None
    if plan.config_dtype:
        return f'dtype="auto" picks {plan.dtype}, the dtype the config names'
    if plan.config.available and plan.dtype != "float32":
        return f'dtype="auto" picks {plan.dtype}, the dtype of the local weights (the config names none)'
    if plan.config.available:
        return 'dtype="auto": neither the config nor local weights name a dtype; float32 assumed'
    return None


def plan_notes(plan: LoadPlan) -> list[str]:
    """Everything worth knowing that is not a problem."""
    out: list[str] = for_target.notes(plan.target, plan.dtype) if plan.target is not None else []
    if plan.target is not None and plan.config.available:
        out += plan._target_quantization[1]
        if plan._attn_on_target:
            out.append(f"attn_implementation={plan.args.attn_implementation!r}: read from transformers' rules for the "
                       f"{plan.target.accelerator.name}, not built here")  # fmt: skip
    if not plan.config.available:
        out.append(f"config not available, so the cell assumes a causal LM ({plan.auto_class})")
    out += plan.arguments.omitted
    out += [n for n in [_dtype_note(plan)] if n]
    attn = plan.args.attn_implementation
    if attn is not None and plan.build is None and plan.config.available and not plan._attn_on_target:
        out.append(f"attn_implementation={attn!r} needs a Hub kernel download at load: not checked")
    if plan.args.use_kernels and not plan._kernel_problems():
        out.append("use_kernels=True needs Hub kernel downloads at load: not checked")
    if plan.args.device_map == "meta":
        out.append("device_map='meta' loads the model without weights (transformers accepts it silently)")
    if plan.args.max_memory is not None and not (
        isinstance(plan.args.device_map, str) and plan.placement and plan.placement.strategy
    ):
        out.append("max_memory only changes anything with device_map auto / balanced / balanced_low_0 / sequential")
    estimate = plan.estimate if plan.config.available else None
    if estimate is not None:
        out += estimate.notes + ([estimate.kv_note] if estimate.kv_note else [])
    placement = plan.placement if plan.config.available else None
    if placement is not None:
        out += placement.notes
    out += preflight_warnings(plan)  # the hook: nbhw.doctor()'s findings this cell would hit, as warnings
    return out


def plan_to_dict(plan: LoadPlan) -> dict[str, Any]:
    """Plain JSON-ready data."""
    args = plan.args
    estimate = plan.estimate if plan.config.available else None
    placement = plan.placement if plan.config.available else None
    return {
        "model": plan.model,
        "config_source": plan.config.source,
        "auto_class": plan.auto_class,
        "arguments": argument.to_dict(args),
        "target": plan.target.label if plan.target is not None else None,
        "dtype": plan.dtype if plan.config.available or args.dtype != "auto" else None,
        "code": plan.code,
        "problems": plan.check(),
        "notes": plan_notes(plan),
        "estimate": estimate.to_dict() if estimate is not None else None,
        "placement": placement.to_dict() if placement is not None else None,
    }


def _estimate_rows(e: Estimate) -> list[tuple[str, str]]:
    kv = e.kv_cache_per_1k_tokens
    growing = len([k for k in e.kv_layers if k.bytes_per_token])
    quant = f", {e.quantization} weights" if e.quantization else ""
    return [
        ("parameters", f"{count(e.parameters)} ({count(e.non_embedding_parameters)} without the input embedding)"),
        ("weights", f"{render.size(e.total_bytes)} in {e.dtype}{quant}"),
        ("largest layer", f"{render.size(e.largest_layer_bytes)}  {', '.join(e.largest_layer[:3])}"),
        ("KV cache", "N/A" if kv is None else f"{render.size(kv)} per 1,000 tokens of one sequence ({growing} layers)"),
        (
            "training",
            f"{render.size(e.training_total)} for weights, gradients and Adam states together "
            f"(largest single stage {render.size(e.training_peak)}); full fine-tuning in {e.training_precision} "
            "mixed precision, batch size 1, activations not included (accelerate's figures)",
        ),
    ]


def _share_rows(p: Placement) -> list[list[str]]:
    rows = []
    for share in p.devices:
        more = f" … +{len(share.names) - 2}" if len(share.names) > 2 else ""
        budget = render.size(share.budget) if share.budget is not None else ""
        layers = str(share.layers) if share.layers else ""
        rows.append([share.device, layers, render.size(share.bytes), budget, ", ".join(share.names[:2]) + more])
    return rows


def _placement_title(plan: LoadPlan, p: Placement) -> str:
    how = f'device_map="{p.strategy}"' if p.strategy else f"device_map={plan.args.device_map!r}"
    if plan.args.device_map is None:
        how = "no device_map"
    return f"{how}, against {p.budget_source}"


SHARE_HEADERS = ("device", "layers", "weights", "budget", "device_map entries")


def _problems_title(problems: list[str], target: Target | None = None) -> str:
    if not problems and target is not None:
        return f"Dry run: transformers' checks, read for {target.label}, accept this plan"
    if not problems:
        return "Dry run: transformers accepts this plan here"
    return f"Dry run: {len(problems)} problem{'s' if len(problems) > 1 else ''}"


def _header(plan: LoadPlan) -> str:
    where = plan.config.source or "not available"
    on = f" on {plan.target.label} — hardware that is not here" if plan.target is not None else ""
    return f"nbhw: load plan for {plan.model!r}{on} (config: {where}; {plan.auto_class}, {plan.dtype})"


def plan_text(plan: LoadPlan, *, code: bool = True) -> str:
    """The plan for a terminal."""
    lines = [_header(plan), ""]
    if code:
        lines += ["Code", *("    " + line if line else "" for line in plan.code.splitlines()), ""]
    problems = plan.check()
    lines += [_problems_title(problems, plan.target), *(f"  - {p}" for p in problems), ""]
    estimate = plan.estimate if plan.config.available else None
    if estimate is not None:
        rows = _estimate_rows(estimate)
        width = max(len(k) for k, _ in rows)
        lines += ["Estimate", *(f"  {k.ljust(width)}  {v}" for k, v in rows), ""]
    placement = plan.placement if plan.config.available else None
    if placement is not None:
        lines += [f"Placement: {placement.verdict}", f"  {_placement_title(plan, placement)}"]
        lines += [render.text_table(SHARE_HEADERS, _share_rows(placement), indent="  "), ""]
    extra = plan_notes(plan)
    if extra:
        lines += ["Notes", *(f"  - {n}" for n in extra)]
    return "\n".join(lines).rstrip() + "\n"


def plan_html(plan: LoadPlan, *, code: bool = True) -> str:
    """The plan as an HTML fragment (every value escaped)."""
    esc = render.esc
    parts = [f'<div class="nbhw-plan"><p><b>{esc(_header(plan))}</b></p>']
    if code:
        parts.append(f'<pre class="nbhw-code">{esc(plan.code)}</pre>')
    problems = plan.check()
    items = "".join(f"<li>{esc(p)}</li>" for p in problems)
    parts.append(
        f"<p><b>{esc(_problems_title(problems, plan.target))}</b></p>" + (f"<ul>{items}</ul>" if items else "")
    )
    estimate = plan.estimate if plan.config.available else None
    if estimate is not None:
        parts.append(
            "<p><b>Estimate</b></p>" + render.html_table(("", ""), [list(r) for r in _estimate_rows(estimate)])
        )
    placement = plan.placement if plan.config.available else None
    if placement is not None:
        parts.append(f"<p><b>Placement: {esc(placement.verdict)}</b><br>{esc(_placement_title(plan, placement))}</p>")
        parts.append(render.html_table(SHARE_HEADERS, _share_rows(placement)))
    extra = plan_notes(plan)
    if extra:
        parts.append("<p><b>Notes</b></p><ul>" + "".join(f"<li>{esc(n)}</li>" for n in extra) + "</ul>")
    parts.append("</div>")
    return "".join(parts)
