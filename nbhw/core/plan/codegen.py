"""The ``from_pretrained`` cell a person would write for a plan: always valid Python, whatever the model string.

Literals are written with ``repr`` (so any model id or path survives: quotes, backslashes, unicode, newlines) and
checked with ``ast`` before they are returned. Only the arguments that change what transformers would do anyway
are written; :func:`call_arguments` says why each other one was left out.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from nbhw.core.plan.arguments import QUANTIZATION, LoadArgs

WIDTH = 88  # black's line length: what most notebook code is formatted to
GENERATE = {"AutoModelForCausalLM", "AutoModelForSeq2SeqLM"}
PREPROCESSOR = {
    "AutoModelForImageClassification": "AutoImageProcessor",
    "AutoModelForImageTextToText": "AutoProcessor",
    "AutoModelForSpeechSeq2Seq": "AutoProcessor",
    "AutoModelForCTC": "AutoProcessor",
}


def py_str(text: str) -> str:
    """A string literal for ``text``, double-quoted like black writes it when that needs no extra escapes."""
    literal = repr(text)
    if literal.startswith("'") and '"' not in text:
        literal = '"' + literal[1:-1].replace("\\'", "'") + '"'
    return literal


def py_literal(value: Any) -> str:
    """Source for an int, a string, or a dict of those."""
    if isinstance(value, bool | int):
        return repr(value)
    if isinstance(value, str):
        return py_str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{py_literal(k)}: {py_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no literal for {type(value).__name__}")


@dataclass
class Arguments:
    """The keyword arguments to write, in order, and why the others were left out."""

    kwargs: list[tuple[str, str]] = field(default_factory=list)
    omitted: list[str] = field(default_factory=list)
    needs_torch: bool = False


def _device_map_is(device_map: Any, device: str) -> bool:
    return device_map in (device, {"": device})


def call_arguments(args: LoadArgs, *, config_dtype: str | None, default_device: str) -> Arguments:
    """The from_pretrained keywords that differ from transformers' own defaults for this model."""
    out = Arguments()
    if args.dtype != "auto" and args.dtype == config_dtype:
        out.omitted.append(f'dtype={args.dtype} is the config\'s own dtype, which the default dtype="auto" picks')
    elif args.dtype != "auto":
        out.kwargs.append(("dtype", f"torch.{args.dtype}"))
        out.needs_torch = True
    if args.device_map is not None and args.quantization is None and _device_map_is(args.device_map, default_device):
        out.omitted.append(f"device_map={args.device_map!r}: from_pretrained loads on {default_device} without one")
    elif args.device_map is not None:
        out.kwargs.append(("device_map", py_literal(args.device_map)))
    if args.max_memory is not None:
        out.kwargs.append(("max_memory", py_literal(args.max_memory)))
    if args.attn_implementation is not None:
        out.kwargs.append(("attn_implementation", py_str(args.attn_implementation)))
    if args.use_kernels:
        out.kwargs.append(("use_kernels", "True"))
    if args.quantization is not None:
        out.kwargs.append(("quantization_config", f"BitsAndBytesConfig({QUANTIZATION[args.quantization]}=True)"))
    return out


def _call(target: str, func: str, positional: str, kwargs: list[tuple[str, str]]) -> str:
    parts = [positional, *(f"{k}={v}" for k, v in kwargs)]
    one_line = f"{target} = {func}({', '.join(parts)})"
    if len(one_line) <= WIDTH:
        return one_line
    body = "".join(f"    {p},\n" for p in parts)
    return f"{target} = {func}(\n{body})"


def cell(model: str, auto_class: str, arguments: Arguments) -> str:
    """The whole cell: imports, the preprocessor, the model, and a short generation for generative models."""
    preprocessor = PREPROCESSOR.get(auto_class, "AutoTokenizer")
    names = {auto_class, preprocessor}
    if any(k == "quantization_config" for k, _ in arguments.kwargs):
        names.add("BitsAndBytesConfig")
    imports = ["import torch"] if arguments.needs_torch else []
    imports.append(f"from transformers import {', '.join(sorted(names))}")
    var = "tokenizer" if preprocessor == "AutoTokenizer" else "processor"
    lines = [
        *imports,
        "",
        f"model_id = {py_str(model)}",
        f"{var} = {preprocessor}.from_pretrained(model_id)",
        _call("model", f"{auto_class}.from_pretrained", "model_id", arguments.kwargs),
    ]
    if auto_class in GENERATE:
        lines += [
            "",
            "# Try it: generate a few tokens",
            'inputs = tokenizer("Hello, my name is", return_tensors="pt").to(model.device)',
            "outputs = model.generate(**inputs, max_new_tokens=20)",
            "print(tokenizer.decode(outputs[0], skip_special_tokens=True))",
        ]
    source = "\n".join(lines) + "\n"
    ast.parse(source)  # a bug here must never reach a user's notebook as a broken cell
    return source
