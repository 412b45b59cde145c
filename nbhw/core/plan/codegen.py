"""The ``from_pretrained`` cell a person would write for a plan: always valid Python, whatever the model string.

Literals are written with ``repr`` (so any model id or path survives: quotes, backslashes, unicode, newlines) and
checked with ``ast`` before they are returned. Only the arguments that change what transformers would do anyway
are written; :func:`call_arguments` says why each other one was left out.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nbhw.core.advice.quantization_methods import config_source
from nbhw.core.plan.arguments import PLAN_ARGUMENTS, QUANTIZATION, PlanArgs
from nbhw.core.render import py_literal, py_str

WIDTH = 88  # black's line length: what most notebook code is formatted to
GENERATE = {"AutoModelForCausalLM", "AutoModelForSeq2SeqLM"}
PREPROCESSOR = {
    "AutoModelForImageClassification": "AutoImageProcessor",
    "AutoModelForImageTextToText": "AutoProcessor",
    "AutoModelForSpeechSeq2Seq": "AutoProcessor",
    "AutoModelForCTC": "AutoProcessor",
}


@dataclass
class Arguments:
    """The keyword arguments to write, in order, and why the others were left out."""

    kwargs: list[tuple[str, str]] = field(default_factory=list)
    omitted: list[str] = field(default_factory=list)
    needs_torch: bool = False
    names: list[str] = field(default_factory=list)  # more names the cell imports from transformers
    imports: list[str] = field(default_factory=list)  # more import lines (a method's own package)
    generate: list[tuple[str, str]] = field(default_factory=list)  # generate() keywords (the cache it makes)


def _device_map_is(device_map: Any, device: str) -> bool:
    return device_map in (device, {"": device})


@dataclass(frozen=True)
class Context:
    """What the emitters need besides the arguments: the config's dtype and where from_pretrained loads by default."""

    config_dtype: str | None
    default_device: str


def _dtype(args: PlanArgs, ctx: Context, out: Arguments) -> None:
    if args.dtype != "auto" and args.dtype == ctx.config_dtype:
        out.omitted.append(f'dtype={args.dtype} is the config\'s own dtype, which the default dtype="auto" picks')
    elif args.dtype != "auto":
        out.kwargs.append(("dtype", f"torch.{args.dtype}"))
        out.needs_torch = True


def _device_map(args: PlanArgs, ctx: Context, out: Arguments) -> None:
    on_default = _device_map_is(args.device_map, ctx.default_device)
    if args.device_map is not None and args.quantization is None and on_default:
        out.omitted.append(f"device_map={args.device_map!r}: from_pretrained loads on {ctx.default_device} without one")
    elif args.device_map is not None:
        out.kwargs.append(("device_map", py_literal(args.device_map)))


def _max_memory(args: PlanArgs, ctx: Context, out: Arguments) -> None:
    if args.max_memory is not None:
        out.kwargs.append(("max_memory", py_literal(args.max_memory)))


def _attn_implementation(args: PlanArgs, ctx: Context, out: Arguments) -> None:
    if args.attn_implementation is not None:
        out.kwargs.append(("attn_implementation", py_str(args.attn_implementation)))


def _use_kernels(args: PlanArgs, ctx: Context, out: Arguments) -> None:
    # Written whenever given, False too: transformers' default moved (on since 5.25), so the cell says what it means.
    if args.use_kernels is not None:
        out.kwargs.append(("use_kernels", str(args.use_kernels)))


def _quantization(args: PlanArgs, ctx: Context, out: Arguments) -> None:
    if args.quantization in QUANTIZATION:
        out.kwargs.append(("quantization_config", f"BitsAndBytesConfig({QUANTIZATION[args.quantization]}=True)"))
        out.names.append("BitsAndBytesConfig")
    elif args.quantization is not None:
        dtype = args.dtype if args.dtype != "auto" else ctx.config_dtype or "bfloat16"
        source = config_source(args.quantization, dtype)  # the expression the quantization advice shows and checks
        out.kwargs.append(("quantization_config", source.expression))
        out.names += source.names
        out.imports += source.imports
        out.needs_torch = out.needs_torch or source.needs_torch


def _cache_implementation(args: PlanArgs, ctx: Context, out: Arguments) -> None:
    if args.cache_implementation is not None:
        out.generate.append(("cache_implementation", py_str(args.cache_implementation)))


# The from_pretrained keyword of each argument that declares one (`emits`), written in declaration order.
EMITTERS: dict[str, Callable[[PlanArgs, Context, Arguments], None]] = {
    "dtype": _dtype,
    "device_map": _device_map,
    "max_memory": _max_memory,
    "attn_implementation": _attn_implementation,
    "use_kernels": _use_kernels,
    "quantization": _quantization,
    "cache_implementation": _cache_implementation,
}


def call_arguments(args: PlanArgs, *, config_dtype: str | None, default_device: str) -> Arguments:
    """The from_pretrained keywords that differ from transformers' own defaults for this model."""
    out = Arguments()
    ctx = Context(config_dtype, default_device)
    for declared in PLAN_ARGUMENTS:
        if declared.emits is not None:
            EMITTERS[declared.name](args, ctx, out)
    return out


def assignment(target: str, func: str, positional: str, kwargs: list[tuple[str, str]]) -> str:
    """``target = func(positional, key=value, ...)``, on one line when it fits, else one argument per line."""
    parts = [positional, *(f"{k}={v}" for k, v in kwargs)]
    one_line = f"{target} = {func}({', '.join(parts)})"
    if len(one_line) <= WIDTH:
        return one_line
    body = "".join(f"    {p},\n" for p in parts)
    return f"{target} = {func}(\n{body})"


def cell(model: str, auto_class: str, arguments: Arguments) -> str:
    """The whole cell: imports, the preprocessor, the model, and a short generation for generative models."""
    preprocessor = PREPROCESSOR.get(auto_class, "AutoTokenizer")
    names = {auto_class, preprocessor, *arguments.names}
    imports = ["import torch"] if arguments.needs_torch else []
    imports.append(f"from transformers import {', '.join(sorted(names))}")
    imports += arguments.imports
    var = "tokenizer" if preprocessor == "AutoTokenizer" else "processor"
    lines = [
        *imports,
        "",
        f"model_id = {py_str(model)}",
        f"{var} = {preprocessor}.from_pretrained(model_id)",
        assignment("model", f"{auto_class}.from_pretrained", "model_id", arguments.kwargs),
    ]
    generate = "".join(f", {k}={v}" for k, v in arguments.generate)
    if auto_class in GENERATE:
        lines += [
            "",
            "# Try it: generate a few tokens",
            'inputs = tokenizer("Hello, my name is", return_tensors="pt").to(model.device)',
            f"outputs = model.generate(**inputs, max_new_tokens=20{generate})",
            "print(tokenizer.decode(outputs[0], skip_special_tokens=True))",
        ]
    else:  # every later generate() call takes them from the model's generation config
        lines += [f"model.generation_config.{k} = {v}" for k, v in arguments.generate]
    source = "\n".join(lines) + "\n"
    ast.parse(source)  # a bug here must never reach a user's notebook as a broken cell
    return source
