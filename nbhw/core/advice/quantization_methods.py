"""The quantization methods transformers knows, read from the installed transformers at run time.

The list is ``AUTO_QUANTIZER_MAPPING`` (a method a new release adds is a new row, a method it drops is gone); how each
loads is read from its quantizer's code (``requires_calibration``, ``get_quantize_ops``, ...). The arguments nbhw
writes for each method's config are nbhw's choice (:data:`EXAMPLES`): the config a gate checks is built by running
that same source, so the code a user gets and the config nbhw checked can't drift apart.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import re
import textwrap
from dataclasses import dataclass
from enum import Enum
from typing import Any

from nbhw.core.errors import one_of
from nbhw.core.hf import meta_build
from nbhw.core.hf.as_if import DEVICE_CHECKS, HELPERS, PACKAGE_CHECK

# The words --quantization has always taken: bitsandbytes 4-bit and 8-bit.
BITSANDBYTES_WORDS = {"4bit": "bitsandbytes_4bit", "8bit": "bitsandbytes_8bit"}


class Loads(str, Enum):
    """How a method gets quantized weights into the model, read from its quantizer's code."""

    ON_LOAD = "quantizes on load"
    CALIBRATED = "quantizes on load from calibration data"
    PREQUANTIZED = "pre-quantized checkpoints only"
    FILE_FORMAT = "a file format: from_pretrained(..., gguf_file=...)"
    NO_OPS = "can't quantize on load in this transformers"

    def __str__(self) -> str:
        return self.value

    @property
    def quantizes_here(self) -> bool:
        """Whether from_pretrained quantizes an unquantized checkpoint with this method (a plan can ask for it)."""
        return self in {Loads.ON_LOAD, Loads.CALIBRATED}


# ---------------------------------------------------------------- nbhw's example arguments per method


@dataclass(frozen=True)
class Example:
    """How nbhw writes a method's config: the constructor (``{dtype}`` becomes torch.<dtype>), and its imports."""

    config: str
    imports: tuple[str, ...] = ()
    gate: str | None = None  # the constructor nbhw checks with, when the code's one needs objects nbhw lacks


# nbhw's choice of sensible arguments, not transformers' knowledge: a method missing here gets `XConfig()`.
EXAMPLES: dict[str, Example] = {
    "awq": Example("AwqConfig(bits=4)"),
    "bitsandbytes_4bit": Example(
        'BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.{dtype})'
    ),
    "bitsandbytes_8bit": Example("BitsAndBytesConfig(load_in_8bit=True)"),
    # The plan's cell loads `tokenizer` before the model; calibration downloads the dataset at load.
    "gptq": Example('GPTQConfig(bits=4, dataset="c4", tokenizer=tokenizer)', gate='GPTQConfig(bits=4, dataset="c4")'),
    "quanto": Example('QuantoConfig(weights="int8")'),
    "eetq": Example('EetqConfig(weights="int8")'),
    "higgs": Example("HiggsConfig(bits=4)"),
    "hqq": Example("HqqConfig(nbits=4, group_size=64)"),
    "torchao": Example(
        "TorchAoConfig(Int8WeightOnlyConfig())", ("from torchao.quantization import Int8WeightOnlyConfig",)
    ),
    "sinq": Example("SinqConfig(nbits=4, group_size=64)"),
    "auto-round": Example("AutoRoundConfig(bits=4)"),
    "mxfp8": Example('FineGrainedFP8Config(quant_method="mxfp8")'),
}
# Methods whose on-load path nbhw doesn't offer even though transformers' quantizer would accept it.
CHECKPOINT_ONLY_BY_CHOICE = {"mxfp8": "nbhw knows no MXFP8 arguments for quantizing on load; MXFP8 checkpoints load"}


# ---------------------------------------------------------------- reading transformers


def _auto() -> Any:
    """transformers.quantizers.auto, imported quietly: it imports every installed quantization package."""
    with meta_build.quiet():
        # lazy: import nbhw and %load_ext nbhw stay free of transformers
        from transformers.quantizers import auto
    return auto


def methods() -> list[str]:
    """Every quantization method this transformers knows, in its own order."""
    return list(_auto().AUTO_QUANTIZER_MAPPING)


def classes(key: str) -> tuple[Any, Any]:
    """(quantizer class, config class) of a method."""
    auto = _auto()
    return auto.AUTO_QUANTIZER_MAPPING[key], auto.AUTO_QUANTIZATION_CONFIG_MAPPING[key]


def method_of(config: Any) -> str:
    """The method key transformers dispatches a config (object or dict) to, bitsandbytes' 4/8-bit split included."""

    def get(name: str, default: Any = None) -> Any:
        return config.get(name, default) if isinstance(config, dict) else getattr(config, name, default)

    if get("load_in_4bit", False) or get("load_in_8bit", False):
        return "bitsandbytes_4bit" if get("load_in_4bit", False) else "bitsandbytes_8bit"
    method = get("quant_method")
    return str(getattr(method, "value", method))


def _overrides(cls: Any, name: str) -> bool:
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.quantizers.base import HfQuantizer

    return getattr(cls, name, None) is not getattr(HfQuantizer, name, None)


def _source(func: Any) -> str:
    try:
        return textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError):
        return ""


def loads(key: str) -> tuple[Loads, str]:
    """How transformers loads weights with this method, and what in its code says so."""
    qcls, _ = classes(key)
    name = qcls.__name__
    if getattr(qcls, "requires_calibration", False):
        return (
            Loads.PREQUANTIZED,
            f"{name}.requires_calibration is True: HfQuantizer.__init__ refuses quantizing on load",
        )
    if "self.pre_quantized = True" in _source(qcls.__init__):
        return Loads.FILE_FORMAT, f"{name}.__init__ sets pre_quantized=True whatever it is given"
    if _overrides(qcls, "param_needs_quantization") and not _overrides(qcls, "get_quantize_ops"):
        return Loads.NO_OPS, (
            f"{name} marks weights for quantization (param_needs_quantization) but has no get_quantize_ops: "
            "HfQuantizer.get_quantize_ops raises NotImplementedError when the first weight loads"
        )
    after = _source(qcls._process_model_after_weight_loading)
    if not _overrides(qcls, "get_quantize_ops") and "quantize_model" in after:
        return Loads.CALIBRATED, f"{name} quantizes after loading (quantize_model) from a calibration dataset"
    if key in CHECKPOINT_ONLY_BY_CHOICE:
        return Loads.PREQUANTIZED, CHECKPOINT_ONLY_BY_CHOICE[key]
    return Loads.ON_LOAD, f"{name}.get_quantize_ops quantizes each weight as it loads"


_WORDS: dict[tuple[tuple[str, Any], ...], list[str]] = {}  # by transformers' mapping: reading each source is slow


def plan_words() -> list[str]:
    """What ``quantization=`` takes: 4bit / 8bit (bitsandbytes), then every method transformers quantizes on load."""
    mapping = tuple(_auto().AUTO_QUANTIZER_MAPPING.items())
    if mapping not in _WORDS:  # every plan's arguments are checked with it: read once per mapping (24 ms each)
        found = [key for key, _ in mapping if loads(key)[0].quantizes_here and key not in BITSANDBYTES_WORDS.values()]
        _WORDS[mapping] = [*BITSANDBYTES_WORDS, *found]
    return list(_WORDS[mapping])


def check_method(value: Any) -> str | None:
    """A ``quantization=`` word: '4bit', '8bit', or a method transformers quantizes on load with; None for none."""
    if value is None:
        return None
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str) and text in BITSANDBYTES_WORDS:
        return str(text)  # without importing transformers' quantizers (and every quantization package they import)
    short = {v: k for k, v in BITSANDBYTES_WORDS.items()}
    if isinstance(text, str) and text in short:
        return short[text]  # bitsandbytes_4bit is what --quantization 4bit has always meant
    words = plan_words()
    if isinstance(text, str) and text in words:
        return text
    if isinstance(text, str) and text in methods():
        how, _ = loads(text)
        raise one_of(f"quantization (transformers' {text} {how})", value, words)
    raise one_of("quantization", value, words)


def method_key(word: str) -> str:
    """The transformers method key of a ``quantization=`` word ('4bit' -> 'bitsandbytes_4bit')."""
    return BITSANDBYTES_WORDS.get(word, word)


# ---------------------------------------------------------------- the config's source, and the config itself


@dataclass(frozen=True)
class ConfigSource:
    """A method's ``quantization_config`` as source: the transformers names and other imports it needs."""

    expression: str
    names: tuple[str, ...]
    imports: tuple[str, ...]
    needs_torch: bool


def config_source(key: str, dtype: str) -> ConfigSource:
    """The ``quantization_config=`` expression nbhw writes for a method, with what it imports."""
    _, ccls = classes(key)
    example = EXAMPLES.get(key, Example(f"{ccls.__name__}()"))
    expression = example.config.replace("{dtype}", dtype)
    return ConfigSource(expression, (ccls.__name__,), example.imports, "torch." in expression)


def build_config(key: str, dtype: str) -> tuple[Any | None, str | None]:
    """The config nbhw's code constructs, built by running that source; (None, why) when it can't be built here."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch
    import transformers  # lazy: import nbhw and %load_ext nbhw stay free of transformers

    _, ccls = classes(key)
    example = EXAMPLES.get(key, Example(f"{ccls.__name__}()"))
    expression = (example.gate or example.config).replace("{dtype}", dtype)
    namespace: dict[str, Any] = {"torch": torch, ccls.__name__: getattr(transformers, ccls.__name__, ccls)}
    try:
        for line in example.imports:
            exec(line, namespace)  # nbhw's own fixed import lines (EXAMPLES), never user text
        return eval(expression, namespace), None  # nbhw's own constructor call (EXAMPLES), never user text
    except Exception as exc:
        return None, one_line(exc)


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and the start of its message."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


# ---------------------------------------------------------------- the Hub kernels a method's load fetches

KERNEL_LOADERS = ("get_kernel", "lazy_load_kernel")  # transformers.integrations.hub_kernels' loaders


def hub_kernels(key: str) -> list[str]:
    """The Hub kernels a method's load fetches, as transformers' code names them, read from the source of the
    integration modules its quantizer imports (``from ..integrations.X import ...``): ``org/repo`` where a loader
    takes a repository literal (``get_kernel("kernels-community/quantization-eetq")``), ``'name' (transformers'
    kernel table)`` where it takes a name (``lazy_load_kernel("nvfp4")``). A name that is not a literal, or a
    module the quantizer reaches another way, is not listed."""
    qcls, _ = classes(key)
    return list(_hub_kernels_of(qcls.__module__))


@functools.cache
def _hub_kernels_of(module_name: str) -> tuple[str, ...]:
    found: list[str] = []
    for integration in _integrations_imported(module_name):
        for name in _kernel_literals(integration):
            if name not in found:
                found.append(name)
    return tuple(found)


def _module_tree(module_name: str) -> ast.Module | None:
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    try:
        with open(spec.origin, encoding="utf-8") as f:
            return ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None


def _integrations_imported(module_name: str) -> list[str]:
    """The ``transformers.integrations.X`` modules a quantizer's module imports by name (without importing any)."""
    tree = _module_tree(module_name)
    if tree is None:
        return []
    package = module_name.rpartition(".")[0]
    out: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        relative = "." * node.level + node.module
        try:
            absolute = importlib.util.resolve_name(relative, package) if node.level else node.module
        except (ImportError, ValueError):
            continue
        if absolute.startswith("transformers.integrations.") and absolute not in out:
            out.append(absolute)
    return out


def _kernel_literals(module_name: str) -> list[str]:
    tree = _module_tree(module_name)
    if tree is None:
        return []
    out: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        first = node.args[0]
        if name in KERNEL_LOADERS and isinstance(first, ast.Constant) and isinstance(first.value, str):
            value = first.value
            out.append(value if "/" in value else f"{value!r} (transformers' kernel table)")
    return out


# ---------------------------------------------------------------- which device calls each quantizer makes

SURVEYED = ("__init__", "validate_environment", "update_device_map", "update_dtype")
TORCH_CALL = re.compile(r"^torch\.(cuda|xpu|npu|hpu|mps|accelerator|backends\.mps|version)\.")


def survey(key: str) -> dict[str, list[str]]:
    """The device and package checks a method's quantizer reads (statically, from its source), by kind."""
    qcls, _ = classes(key)
    device: list[str] = []
    packages: list[str] = []
    seen: set[str] = set()
    for name in SURVEYED:
        func = getattr(qcls, name, None)
        if func is not None and getattr(func, "__qualname__", "").split(".")[0] != "HfQuantizer":
            _survey(func, device, packages, seen)
    return {"device": device, "packages": packages}


def _survey(func: Any, device: list[str], packages: list[str], seen: set[str]) -> None:
    src = _source(func)
    if not src or func.__qualname__ in seen:
        return
    seen.add(func.__qualname__)
    module = inspect.getmodule(func)
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Attribute):
            chain = _chain(node)
            if chain and TORCH_CALL.match(chain) and chain not in device:
                device.append(chain)
        elif isinstance(node, ast.Name):
            _survey_name(node.id, module, device, packages, seen)
        elif isinstance(node, ast.ImportFrom) and node.module and "integrations" in node.module:
            integrations = importlib.import_module("transformers.integrations")
            for alias in node.names:
                helper = getattr(integrations, alias.name, None)
                if inspect.isfunction(helper):
                    _survey(helper, device, packages, seen)


def _survey_name(name: str, module: Any, device: list[str], packages: list[str], seen: set[str]) -> None:
    if name in DEVICE_CHECKS or name in HELPERS:
        if name not in device:
            device.append(name)
    elif PACKAGE_CHECK.match(name):
        if name not in packages:
            packages.append(name)
    else:
        helper = getattr(module, name, None) if module else None
        if inspect.isfunction(helper) and helper.__module__.startswith("transformers.integrations"):
            _survey(helper, device, packages, seen)


def _chain(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None
