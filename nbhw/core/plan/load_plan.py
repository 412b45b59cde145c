"""``nbhw.plan()``: the from_pretrained cell for a model, its dry run, memory estimate and placement.

Nothing here downloads weights or kernels, and nothing creates a CUDA context: the model is built on the meta
device through transformers' own ``__init__`` (see :mod:`nbhw.core.hf.meta_build`), free memory comes from nbhw's
probes, and the config comes from a local folder, the HF cache, or (only when online and allowed) the Hub.
"""

from __future__ import annotations

import copy
import re
import threading
from collections import OrderedDict
from functools import cached_property
from pathlib import Path
from typing import Any

from nbhw.core.hf import meta_build, model_config
from nbhw.core.plan import codegen
from nbhw.core.plan.arguments import DISK, QUANTIZATION, LoadArgs, load_args
from nbhw.core.plan.estimate import Estimate
from nbhw.core.plan.placement import LiveMemory, Placement
from nbhw.core.plan.quantized_sizes import PlanningQuantizer
from nbhw.core.render import Shown

_BUILDS: OrderedDict[tuple[str, str, str, str | None], meta_build.MetaBuild] = OrderedDict()
_BUILDS_LOCK = threading.Lock()
BUILD_CACHE_SIZE = 6
FALLBACK_AUTO_CLASS = "AutoModelForCausalLM"


def _config_key(config: Any) -> str:
    return f"{type(config).__name__}:{config.to_json_string(use_diff=False)}"


def cached_build(config: Any, auto_name: str, dtype: str, attn: str | None) -> meta_build.MetaBuild:
    """A meta build, shared by every plan with the same config, class, dtype and attention (the model is read-only)."""
    key = (_config_key(config), auto_name, dtype, attn)
    with _BUILDS_LOCK:
        if key in _BUILDS:
            _BUILDS.move_to_end(key)
            return _BUILDS[key]
    built = meta_build.build(config, dtype=dtype, attn_implementation=attn, auto_name=auto_name)
    with _BUILDS_LOCK:
        _BUILDS[key] = built
        while len(_BUILDS) > BUILD_CACHE_SIZE:
            _BUILDS.popitem(last=False)
    return built


def clear_cache() -> None:
    """Forget the cached meta builds."""
    with _BUILDS_LOCK:
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

    def __init__(self, model: str, args: LoadArgs, *, offline: bool = False) -> None:
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
    def _rows(self) -> list[Any]:
        from nbhw.core.hardware import backends

        return backends.probe_all()

    @cached_property
    def default_device(self) -> str:
        """Where from_pretrained puts the model without a device_map (cpu, unless a torch default device is set)."""
        from nbhw.core.hardware.who_picks import from_pretrained_default

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
    def build(self) -> meta_build.MetaBuild | None:
        """The meta build with your dtype and attn_implementation (None without a config or if it needs a download)."""
        if not self.config.available or self._attn_download:
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
        with meta_build.quiet():
            return PlanningQuantizer(self.args.quantization)

    # ------------------------------------------------------------ estimate and placement

    @cached_property
    def estimate(self) -> Estimate | None:
        """Parameters, bytes, largest layer, KV cache per 1,000 tokens, training; None without a config."""
        from nbhw.core.plan import estimate

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
        """The free memory device_map="auto" would fill here, read now."""
        from nbhw.core.plan.placement import live_memory

        return live_memory(self._rows)

    @cached_property
    def placement(self) -> Placement | None:
        """The device_map transformers would compute, per device, with a verdict; None without a config."""
        from nbhw.core.plan.placement import place

        model = self.meta_model
        if model is None:
            return None
        return place(model, self.args, quantizer=self.quantizer, default_device=self.default_device, live=self.live)

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
        problems += self._quantization_problems()
        placement = self.placement
        if placement is not None:
            problems += placement.problems
            problems += self.quantizer.errors if self.quantizer is not None else []
            problems += self._device_problems(placement)
            if build is not None and build.ok:
                problems += self._flash_problems(placement)
        return problems

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
        from transformers import BitsAndBytesConfig
        from transformers.integrations.accelerate import check_and_set_device_map
        from transformers.quantizers.auto import get_hf_quantizer

        asked = None
        if self.args.quantization is not None:
            asked = BitsAndBytesConfig(**{QUANTIZATION[self.args.quantization]: True})
        try:
            with meta_build.quiet():
                device_map = check_and_set_device_map(copy.deepcopy(self.args.device_map))
                get_hf_quantizer(copy.deepcopy(self.config.config), asked, device_map, True, {})
        except Exception as exc:
            what = f"quantization={self.args.quantization}" if asked is not None else "this pre-quantized checkpoint"
            return [f"{what}: {type(exc).__name__}: {' '.join(str(exc).split())}"]
        return []

    def _device_problems(self, placement: Placement) -> list[str]:
        from nbhw.core.hardware import presence

        return presence.absent(list(placement.device_map.values()), self._rows, self.live.accelerator)

    def _flash_problems(self, placement: Placement) -> list[str]:
        from nbhw.core.hardware import presence

        impl = (self.args.attn_implementation or "").removeprefix("paged|")
        m = re.fullmatch(r"flash_attention_(\d)", impl)
        if m is None or not meta_build.flash_package_installed(int(m.group(1))):
            return []
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
        from nbhw.core.plan import plan_view

        return plan_view.notes(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data: arguments, code, problems, notes, estimate, placement."""
        from nbhw.core.plan import plan_view

        return plan_view.to_dict(self)

    def text(self, *, code: bool = True) -> str:
        """The plan as text for terminals (``code=False`` leaves out the cell)."""
        from nbhw.core.plan import plan_view

        return plan_view.text(self, code=code)

    def html(self, *, code: bool = True) -> str:
        """The plan as an HTML fragment."""
        from nbhw.core.plan import plan_view

        return plan_view.html(self, code=code)

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
    """A plan from the parsed words of ``%hw load`` / ``python -m nbhw plan`` (see nbhw.commands)."""
    from nbhw.core.plan.arguments import device_map_from_text

    return plan(
        args.model,
        device_map="auto" if args.device_map is None else device_map_from_text(args.device_map),
        dtype=args.dtype or "auto",
        attn_implementation=args.attn_implementation,
        use_kernels=args.use_kernels,
        quantization=args.quantize,
        max_memory=args.max_memory,
        offline=args.offline,
    )


def plan(
    model: str | Path | None = None,
    *,
    device_map: Any = "auto",
    dtype: Any = "auto",
    attn_implementation: str | None = None,
    use_kernels: bool = False,
    quantization: str | None = None,
    max_memory: Any = None,
    offline: bool = False,
) -> LoadPlan:
    """Plan ``from_pretrained(model, ...)`` for this machine (or for the ``max_memory`` you name).

    ``model`` is a Hub id or a local folder; None plans nbhw's tiny local model. Mistakes in the arguments raise a
    one-line :class:`~nbhw.core.errors.UserError` naming the valid values. Same words on the command line:
    ``python -m nbhw plan MODEL --device-map auto --dtype bfloat16 --max-memory 0=70GiB cpu=200GiB``.

    >>> p = nbhw.plan("Qwen/Qwen3-0.6B", dtype="bfloat16")   # doctest: +SKIP
    >>> print(p.code); p.check(); p.estimate; p.placement     # doctest: +SKIP
    """
    if model is None:
        from nbhw.core.hf.tiny_model import tiny_model_path

        model = tiny_model_path()
    name = str(model)
    model_config.kind(name)  # a mistyped path or id is a UserError now, not a problem later
    args = load_args(
        device_map=device_map,
        dtype=dtype,
        attn_implementation=attn_implementation,
        use_kernels=use_kernels,
        quantization=quantization,
        max_memory=max_memory,
    )
    return LoadPlan(name, args, offline=offline)
