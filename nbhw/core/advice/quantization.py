"""``nbhw.quantization()``: every quantization method transformers knows, for this machine and for a target.

One row per method of the installed transformers (:mod:`nbhw.core.advice.quantization_methods`), each with how it
loads, whether it works here and on the target and why (:mod:`nbhw.core.advice.quantization_gates`: transformers'
own checks), the fix, the model's weight bytes with it and how they were computed
(:mod:`nbhw.core.advice.quantization_sizes`), and the ``quantization_config=...`` cell. A checkpoint that is already
quantized says which method and where it runs. ``%hw quantization [MODEL] [--target NAME]``; ``python -m nbhw
quantization ...``.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field
from typing import Any

from nbhw.core.advice import precision
from nbhw.core.advice.arguments import QUANTIZATION_ARGUMENTS, QuantizationArgs
from nbhw.core.advice.attention_rules import Target, catalog_target, described, parse_device
from nbhw.core.advice.quantization_gates import READ, Gate, Where, documented_gates, gate, install_hint
from nbhw.core.advice.quantization_methods import (
    Loads,
    build_config,
    classes,
    config_source,
    loads,
    method_key,
    method_of,
    methods,
    one_line,
    survey,
)
from nbhw.core.advice.quantization_sizes import Size, weight_bytes
from nbhw.core.advice.status import Status
from nbhw.core.argument import checked, signature
from nbhw.core.dtypes import AUTO
from nbhw.core.errors import UserError
from nbhw.core.hardware.data import BackendStatus, to_plain
from nbhw.core.hardware.detect import detect
from nbhw.core.hardware.targets import Target as CatalogTarget
from nbhw.core.hardware.targets import target_of
from nbhw.core.hf import meta_build, model_config
from nbhw.core.render import STYLE, Shown, esc, html_table, py_str, size, text_table

MODEL_PLACEHOLDER = "MODEL"
WHY_WIDTH = 110  # the text table's why column; the full text is in to_dict() and the HTML


# ---------------------------------------------------------------- where a gate is read


def where_for(t: Target, dtype: str | None = None, device_map: Any = None) -> Where:
    """A device the advice is for (this machine's, or a catalog target's) as the gates and the code see it."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    advised = precision.advise(t.device, t.device_type, t.info, t.count).dtype
    chosen = advised if dtype in {None, AUTO} else str(dtype)
    device = described(t)
    kind = device.torch_type if device is not None else "cpu"
    first = kind if kind in {"cpu", "mps"} else f"{kind}:0"
    code_map = first if t.count <= 1 else "auto"
    if device_map is None:
        try:
            device_map = {"": torch.device(first)} if t.count <= 1 else "auto"
        except RuntimeError:  # 'tpu' / 'neuron' are torch device types only once their plugin is imported
            device_map = {"": first}
    label = t.catalog.label if t.catalog is not None else f"this machine ({t.device})"
    return Where(label, device, device_map, chosen, t.device_type, code_map, t.catalog is not None)


_HERE: dict[tuple[tuple[str, bool, int], ...], Target] = {}


def here_target(rows: list[BackendStatus] | None = None) -> Target:
    """This machine's best usable device, as the attention advisor picks it; given ``rows`` (a read of the backends
    already made, a plan's), detection runs once per set of usable devices they show (it takes ~0.5 s)."""
    if rows is None:
        return parse_device(None, detect().backends)
    seen = tuple((r.key, r.usable, len(r.devices)) for r in rows)
    if seen not in _HERE:
        _HERE[seen] = parse_device(None, detect().backends)
    return _HERE[seen]


# ---------------------------------------------------------------- rows


@dataclass
class QuantRow:
    """One method: how it loads, its verdict here and on the target, weight bytes and the code."""

    method: str
    config_class: str
    quantizer_class: str
    loads: Loads
    loads_why: str
    here: Gate
    target: Gate | None
    size: Size | None
    config: str  # the quantization_config=... expression
    code: str  # the whole cell
    checks: dict[str, list[str]]  # the device and package checks its quantizer reads (from its source)

    @property
    def shown(self) -> Gate:
        """The verdict a view leads with: the target's when there is one."""
        return self.target or self.here


@dataclass
class CheckpointVerdict:
    """A checkpoint that is already quantized: its method, and whether it loads here and on the target."""

    method: str
    here: Gate
    target: Gate | None = None


@dataclass
class QuantizationAdvice(Shown):
    """``nbhw.quantization()``: one row per method transformers knows; ``.row(method)``, ``to_dict()``."""

    model: str | None
    here: str
    target: str | None
    not_here: str | None
    dtype: str
    rows: list[QuantRow]
    transformers: str
    checkpoint: CheckpointVerdict | None = None
    notes: list[str] = field(default_factory=list)

    def row(self, method: str) -> QuantRow:
        """The row of one method (transformers' key: 'bitsandbytes_4bit', 'torchao', ...)."""
        for r in self.rows:
            if r.method == method:
                return r
        raise KeyError(method)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        data: dict[str, Any] = to_plain(self)
        return data

    def text(self) -> str:
        """The advice as aligned text."""
        return advice_text(self)

    def html(self) -> str:
        """The advice as an HTML fragment."""
        return advice_html(self)


def row_code(key: str, model: str, where: Where, dtype: str, how: Loads) -> str:
    """The from_pretrained cell for this method on ``where``: always valid Python."""
    name = py_str(model)
    load = f"dtype=torch.{dtype}, device_map={py_str(where.code_device_map)}"
    if how is Loads.FILE_FORMAT:
        lead = f"# {key}: a file format; this loads one .gguf file of the repository (name yours)"
        lines = [lead, *_imports(()), "", _load(name, 'gguf_file="model-Q4_K_M.gguf", ' + load)]
    elif how in {Loads.PREQUANTIZED, Loads.NO_OPS}:
        lead = f'# {key}: {how} (their config.json names quantization_config.quant_method "{key}")'
        lines = [lead, *_imports(()), "", _load(name, load)]
    else:
        source = config_source(key, dtype)
        tokenizer = "tokenizer" in source.expression  # calibration reads the model's tokenizer
        lines = [*_imports((*source.names, *(["AutoTokenizer"] if tokenizer else []))), *source.imports, ""]
        lines += [f"tokenizer = AutoTokenizer.from_pretrained({name})"] if tokenizer else []
        lines += [
            f"quantization_config = {source.expression}",
            _load(name, f"quantization_config=quantization_config, {load}"),
        ]
    code = "\n".join(lines) + "\n"
    ast.parse(code)  # nbhw's promise: the cell parses
    return code


def _imports(names: tuple[str, ...]) -> list[str]:
    return ["import torch", f"from transformers import {', '.join(sorted({'AutoModelForCausalLM', *names}))}"]


def _load(name: str, keywords: str) -> str:
    one = f"model = AutoModelForCausalLM.from_pretrained({name}, {keywords})"
    return one if len(one) <= 88 else f"model = AutoModelForCausalLM.from_pretrained(\n    {name}, {keywords}\n)"


def _gate_on(key: str, config: Any, problem: str | None, where: Where, how: Loads) -> Gate:
    if config is None:
        missing = any(word in (problem or "") for word in ("ImportError", "ModuleNotFoundError"))
        status = Status.PACKAGE if missing else Status.NOT_CHECKED
        g = Gate(status, f"the config can't be built here: {problem}", install_hint(problem), READ)
    else:
        pre = how in {Loads.PREQUANTIZED, Loads.FILE_FORMAT}
        g = documented_gates(key, where, config) or gate(key, config, where, pre_quantized=pre)
    if how is Loads.NO_OPS and g.status in {Status.WORKS, Status.PACKAGE}:
        fix = "another method (quanto, torchao, bitsandbytes), or a pre-quantized checkpoint"
        return Gate(Status.WONT, loads(key)[1], fix, READ, g.installs, g.calls, g.notes)
    return g


def _row(key: str, model: str | None, config_of_model: Any, here: Where, there: Where | None) -> QuantRow:
    qcls, ccls = classes(key)
    how, how_why = loads(key)
    shown = there or here
    config, problem = build_config(key, shown.dtype)
    gates = [_gate_on(key, config, problem, w, how) for w in ([here, there] if there is not None else [here])]
    dtype = gates[-1].dtype or shown.dtype
    sized = None
    if config_of_model is not None and config is not None:
        sized = weight_bytes(key, config_of_model, config, dtype, quantized=gates[-1].status is not Status.DEQUANTIZED)
    return QuantRow(
        key, ccls.__name__, qcls.__name__, how, how_why, gates[0], gates[1] if there is not None else None, sized,
        config_source(key, dtype).expression, row_code(key, model or MODEL_PLACEHOLDER, shown, dtype, how), survey(key),
    )  # fmt: skip


def checkpoint_verdict(config_of_model: Any, here: Where, there: Where | None) -> CheckpointVerdict | None:
    """A checkpoint that is already quantized: which method, and whether it loads here / on the target."""
    qc = getattr(config_of_model, "quantization_config", None)
    if qc is None:
        return None
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.quantizers.auto import AutoHfQuantizer, AutoQuantizationConfig

    as_dict = qc if isinstance(qc, dict) else qc.to_dict()
    if not AutoHfQuantizer.supports_quant_method(as_dict):
        unknown = Gate(Status.WONT, "transformers doesn't know this quantization method", "a newer transformers")
        return CheckpointVerdict(str(as_dict.get("quant_method")), unknown, unknown if there else None)
    try:
        config = AutoQuantizationConfig.from_dict(copy.deepcopy(as_dict))
    except Exception as exc:
        g = Gate(Status.PACKAGE if isinstance(exc, ImportError) else Status.WONT, one_line(exc))
        return CheckpointVerdict(method_of(as_dict), g, g if there else None)
    key = method_of(config)

    def on(where: Where) -> Gate:
        return documented_gates(key, where, config) or gate(key, config, where, pre_quantized=True)

    return CheckpointVerdict(key, on(here), on(there) if there is not None else None)


def _model_config(model: str, offline: bool) -> tuple[Any, str | None]:
    with meta_build.quiet():
        found = model_config.load(model, offline=offline)
    if not found.available:
        raise UserError(f"{model}: {found.problem}")
    return found.config, found.source


def advise(model: str | None = None, *, offline: bool = False, **arguments: Any) -> QuantizationAdvice:
    """Every quantization method transformers knows, for ``model`` here and on ``target`` ('2x H100', 'T4', ...).

    ``%hw quantization [MODEL] [--target NAME] [--dtype DTYPE]`` in a notebook, ``python -m nbhw quantization ...``
    in a terminal. Without a model the rows carry no weight bytes. Never downloads weights.
    """
    import transformers  # lazy: import nbhw and %load_ext nbhw stay free of transformers

    asked: QuantizationArgs = checked(QuantizationArgs, arguments)
    found = target_of(asked.target)
    config_of_model = _model_config(model, offline)[0] if model else None
    here = where_for(here_target(), asked.dtype)
    there = where_for(catalog_target(found), asked.dtype) if found is not None else None
    with meta_build.quiet():
        rows = [_row(key, model, config_of_model, here, there) for key in methods()]
        verdict = checkpoint_verdict(config_of_model, here, there) if config_of_model is not None else None
    return QuantizationAdvice(
        model=model, here=here.label, target=found.label if found else None,
        not_here=found.not_here if found else None, dtype=(there or here).dtype, rows=rows,
        transformers=str(transformers.__version__), checkpoint=verdict, notes=_notes(rows, found),
    )  # fmt: skip


advise.__signature__ = signature(advise, QUANTIZATION_ARGUMENTS, keep=("model", "offline"))  # type: ignore[attr-defined]


def _notes(rows: list[QuantRow], target: CatalogTarget | None) -> list[str]:
    notes = [f"{len(rows)} methods: transformers' own list (AUTO_QUANTIZER_MAPPING), read from the installed version"]
    if target is not None:
        notes.append(
            f"on the {target.accelerator.name}: transformers' own checks, run as if on it (copies of its functions "
            "answering for the target; nothing is patched); a package this machine lacks is assumed installed there"
        )
    return notes


# ---------------------------------------------------------------- the plan's dry run


def plan_check(
    word: str | None, config_of_model: Any, device_map: Any, dtype: str, target: CatalogTarget
) -> tuple[list[str], list[str]]:
    """What transformers' checks say, as if on ``target``, about the quantization a plan asks for or the checkpoint's.

    (problems, notes): a method that won't work on the target is a problem; one that needs a package installed
    there, dequantizes there, or fetches a Hub kernel at load, is a note.
    """
    where = where_for(catalog_target(target), dtype, device_map)
    if word is not None:
        key = method_key(word)
        config, problem = build_config(key, dtype)
        g = _gate_on(key, config, problem, where, loads(key)[0])
        what = f"quantization={word!r}"
    else:
        verdict = checkpoint_verdict(config_of_model, where, None)
        if verdict is None:
            return [], []
        g, what = verdict.here, f"this pre-quantized checkpoint ({verdict.method})"
    line = f"{what} on the {target.accelerator.name}: {g.status}: {g.why}" + (f" (fix: {g.fix})" if g.fix else "")
    if g.status in {Status.WONT, Status.NOT_CHECKED}:
        return [line], []
    return [], [line] if g.status is not Status.WORKS or g.downloads else []


def here_check(word: str, dtype: str, device_map: Any, rows: list[BackendStatus]) -> list[str]:
    """The gate of the quantization a plan asks for, on this machine (``rows``: the plan's read of its backends), as
    nbhw.quantization() reads it: a problem with its reason and fix unless it works (a package missing here is a
    problem here, unlike on a target)."""
    key = method_key(word)
    config, problem = build_config(key, dtype)
    g = _gate_on(key, config, problem, where_for(here_target(rows), dtype, device_map), loads(key)[0])
    if g.status in {Status.WORKS, Status.DEQUANTIZED}:
        return []
    return [f"quantization={word} here: {g.status}: {g.why}" + (f" (fix: {g.fix})" if g.fix else "")]


# ---------------------------------------------------------------- the advice as text and HTML

HEADERS = ("method", "loads", "here", "target", "weights", "why", "fix")


def _size(row: QuantRow) -> str:
    return size(row.size.bytes) if row.size is not None and row.size.bytes is not None else "-"


def _title(a: QuantizationAdvice) -> str:
    what = f"{a.model}" if a.model else "this hardware alone (no model: no weight bytes)"
    where = f"on {a.target} and on {a.here}" if a.target else f"on {a.here}"
    return f"nbhw quantization: {what} {where}, dtype {a.dtype}, transformers {a.transformers}"


def _cells(a: QuantizationAdvice, row: QuantRow, width: int | None) -> list[str]:
    g = row.shown
    why = g.why if width is None or len(g.why) <= width else g.why[: width - 1] + "…"
    target = str(row.target.status) if row.target is not None else "-"
    return [row.method, str(row.loads), str(row.here.status), target, _size(row), why, g.fix or ""]


def _headers(a: QuantizationAdvice) -> list[str]:
    return [*HEADERS[:3], f"on {a.target}" if a.target else "target", *HEADERS[4:]]


def _checkpoint_lines(a: QuantizationAdvice) -> list[str]:
    c = a.checkpoint
    if c is None:
        return []
    lines = [f"This checkpoint is already quantized: {c.method}. Here: {c.here.status} — {c.here.why}"]
    if c.target is not None:
        lines.append(f"On {a.target}: {c.target.status} — {c.target.why}")
    return lines


def _size_sources(a: QuantizationAdvice) -> list[str]:
    return [f"{r.method}: {r.size.source}" for r in a.rows if r.size is not None]


def advice_text(a: QuantizationAdvice) -> str:
    """The rows for terminals, then the checkpoint's own method, the configs and how each size was computed."""
    lead = [a.not_here] if a.not_here else []
    rows = [_cells(a, r, WHY_WIDTH)[:6] for r in a.rows]
    out = [*lead, _title(a), *(f"  {n}" for n in a.notes), "", text_table(_headers(a)[:6], rows, indent="  ")]
    out += ["", *_checkpoint_lines(a)] if a.checkpoint else []
    fixes = [f"  {r.method}: {r.shown.fix}" for r in a.rows if r.shown.fix]
    out += ["", "Fixes" + (f" (on {a.target})" if a.target else "") + ":", *fixes] if fixes else []
    usable = [r for r in a.rows if r.loads.quantizes_here]
    out += ["", "quantization_config=... (the whole cell: .row(method).code):"]
    out += [f"  {r.method}: {r.config}" for r in usable]
    if a.model:
        out += ["", "How the weight bytes were computed:", *(f"  {s}" for s in _size_sources(a))]
    return "\n".join(out) + "\n"


def _status_cells(table: str) -> str:
    for status in Status:
        cell = f'<td class="{status.css}" style="white-space: nowrap">{esc(status)}</td>'
        table = table.replace(f"<td>{esc(status)}</td>", cell)
    return table


def advice_html(a: QuantizationAdvice) -> str:
    """The advice as an HTML fragment for Jupyter: the table, then each method's cell."""
    parts = [STYLE, '<div class="nbhw nbhw-quantization">']
    parts += [f'<p class="warn"><b>{esc(a.not_here)}</b></p>'] if a.not_here else []
    parts.append(f"<h3>{esc(_title(a))}</h3>" + "".join(f'<p class="src">{esc(n)}</p>' for n in a.notes))
    table = html_table(_headers(a), [_cells(a, r, None) for r in a.rows], css_class="nbhw-table nbhw-quantization")
    parts.append(_status_cells(table))
    parts += [f"<p>{esc(line)}</p>" for line in _checkpoint_lines(a)]
    for r in a.rows:
        how = f"<p class='src'>{esc(r.size.source)}</p>" if r.size is not None else ""
        parts.append(
            f"<details><summary>{esc(r.method)}: the cell</summary>{how}<pre><code>{esc(r.code)}</code></pre></details>"
        )
    parts.append("</div>")
    return "".join(parts)
