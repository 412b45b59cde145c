"""``nbhw.attention()``: which ``attn_implementation``, Hub kernels and dtype will really work here.

Every row comes from the installed transformers: the keys from its attention registry, the flash-attention rules
from its compatibility matrix, the Hub fallbacks from its kernel tables. nbhw first reads those rules for the
target device; then, where a build here can answer (the row doesn't depend on a device this process can't see,
and nothing would be downloaded), it builds the model on the meta device with that ``attn_implementation``
(:func:`nbhw.core.hf.meta_build.build`, the validation ``from_pretrained`` runs) and reports what transformers did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nbhw.core.advice import precision
from nbhw.core.advice.arguments import ADVICE_ARGUMENTS, AdviceArgs
from nbhw.core.advice.attention_rules import (
    FLASH_KEY,
    AttentionRow,
    Env,
    ModelFacts,
    Target,
    build_for,
    catalog_target,
    check,
    kernels_install,
    model_facts,
    parse_device,
)
from nbhw.core.advice.precision import DtypeAdvice
from nbhw.core.advice.status import Status
from nbhw.core.argument import checked, signature
from nbhw.core.errors import UserError
from nbhw.core.hardware.data import to_plain
from nbhw.core.hardware.detect import detect
from nbhw.core.hardware.targets import target_of, target_word
from nbhw.core.hf import kernel_tables, meta_build
from nbhw.core.hf.kernel_tables import KernelEntry
from nbhw.core.render import STYLE, Shown, esc, html_table, py_str, text_table

# ---------------------------------------------------------------- the advice


@dataclass
class DefaultAttention:
    """What ``attn_implementation=None`` (the default) gives for this model."""

    resolves_to: str
    reason: str
    checked: bool


@dataclass
class KernelsAdvice:
    """``use_kernels=True``: can it work here, which layers it would swap, and how to pass a KernelConfig."""

    use_kernels: bool
    reason: str
    default: kernel_tables.KernelsDefault  # what from_pretrained does when the call leaves use_kernels out
    fix: str | None
    device_key: str
    kernel_config_keys: list[str]
    layers: list[KernelEntry]
    model_layers: list[str]
    source: str
    problem: str | None
    example: str


@dataclass
class AttentionAdvice(Shown):
    """The advisor's answer; renders as a table in Jupyter and as text elsewhere; ``to_dict()`` for JSON."""

    model: str | None
    model_source: str | None
    model_class: str
    auto_class: str
    device: str
    device_type: str
    present: bool
    live: bool
    seen: str
    dtype: str
    dtype_given: bool
    default: DefaultAttention
    rows: list[AttentionRow]
    kernels: KernelsAdvice
    precision: DtypeAdvice
    notes: list[str]
    silent: list[str]
    transformers: str
    target: str | None = None  # the catalog target the advice is for (as target= takes it): hardware not here
    not_here: str | None = None

    def row(self, key: str) -> AttentionRow:
        """The row for one attn_implementation value."""
        for r in self.rows:
            if r.key == key:
                return r
        raise KeyError(key)

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


def registry_keys() -> list[str]:
    """Every attn_implementation transformers accepts by name: 'eager' plus its AttentionInterface keys."""
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    keys = ["eager"]
    keys += [k for k in ALL_ATTENTION_FUNCTIONS.valid_keys() if k not in keys]
    return keys


def _order(key: str) -> tuple[int, int, str]:
    flash = FLASH_KEY.match(key.removeprefix("paged|"))
    rank = {"eager": 0, "sdpa": 1, "flex_attention": 2}.get(key.removeprefix("paged|"), 3 if flash else 4)
    return (1 if key.startswith("paged|") else 0, rank, key)


def keys_and_kinds(env: Env, kernel: str | None) -> list[tuple[str, str]]:
    """The rows: transformers' registry, the deprecated paged| aliases, the Hub fallbacks, and the user's kernel."""
    registered = registry_keys()
    keys = list(registered)
    # transformers strips "paged|" from any other key (deprecated), so each one is a valid value too.
    keys += [f"paged|{k}" for k in registered if "|" not in k and k != "eager" and f"paged|{k}" not in keys]
    rows = [(k, "paged" if k.startswith("paged|") else "registry") for k in sorted(keys, key=_order)]
    for repo in dict.fromkeys(env.fallback.values()):
        if repo not in keys:
            rows.append((repo, "hub kernel"))
    if kernel and kernel not in [k for k, _ in rows]:
        rows.append((kernel, "your kernel"))
    return rows


def _default(env: Env) -> DefaultAttention:
    built = build_for(None, env)
    m = env.model
    if built.ok and built.model is not None:
        got = str(built.model.config._attn_implementation)
        if got == "eager" and not m.supports_sdpa:
            why = f"means sdpa, but {m.class_name} has no sdpa: transformers falls back to eager silently"
        else:
            why = f"means {got} (for a class without sdpa, transformers would fall back to eager silently)"
        return DefaultAttention(got, why, True)
    fallback = "sdpa" if m.supports_sdpa else "eager"
    return DefaultAttention(fallback, f"means sdpa, or eager without sdpa; a build failed: {built.error}", False)


def _kernels_advice(env: Env, example_model: str) -> KernelsAdvice:
    t = env.target
    mapping = kernel_tables.default_mapping()
    keys = kernel_tables.kernel_config_devices()
    layers = mapping.for_device(t.device_type)
    cls = meta_build.model_class(env.model.config, env.model.auto_class)
    model_layers = kernel_tables.model_kernel_layers(cls)
    enabled, env_value = kernel_tables.hub_kernels_enabled()
    fix = None
    if not env.kernels_ok and t.catalog is not None:
        fix = f"{kernels_install(env)} on the {t.catalog.accelerator.name} (not installed here)"
    if not env.kernels_ok and t.catalog is None:
        ok, why, fix = False, f"use_kernels=True needs the kernels package: {env.kernels_why}", kernels_install(env)
    elif not enabled:
        ok, why, fix = False, f"USE_HUB_KERNELS={env_value} turns Hub kernels off", "unset USE_HUB_KERNELS"
    elif not layers:
        ok, why = False, f"transformers' default mapping has no kernels for {t.device_type}: nothing would be swapped"
    elif not {e.layer for e in layers} & set(model_layers):
        ok, why = False, f"none of {env.model.class_name}'s marked layers has a {t.device_type} kernel in the mapping"
    else:
        usable = "kernels is usable" if env.kernels_ok else "with kernels installed there"
        ok, why = True, f"{usable}; the default mapping swaps {len(layers)} layer kinds on {t.device_type}"
    return KernelsAdvice(
        ok, why, kernel_tables.kernels_default(), fix, t.device_type, keys, layers, model_layers, mapping.source,
        mapping.problem,
        _kernel_example(t.device_type, keys, layers, model_layers, example_model),
    )  # fmt: skip


def _kernel_example(
    device_key: str, keys: list[str], layers: list[KernelEntry], model_layers: list[str], model: str
) -> str:
    name = py_str(model)  # a folder may hold quotes or backslashes: the example stays valid Python
    if device_key not in keys:
        return (
            f"# KernelConfig accepts device keys {', '.join(keys)}; {device_key} is not one of them.\n"
            f"model = AutoModelForCausalLM.from_pretrained({name}, use_kernels=True)"
        )
    if not model_layers:
        return "# this model class marks no layer for Hub kernels: use_kernels=True would change nothing"
    pick = next((e for e in layers if e.layer in model_layers and e.repos), None)
    layer, repo = (pick.layer, pick.repos[0]) if pick else (model_layers[0], "ORG/REPO:LAYER")
    lead = "" if pick else f"# the default mapping has no {device_key} kernel for {layer}: name your own\n"
    return lead + (
        "from transformers import AutoModelForCausalLM, KernelConfig\n"
        f'kernel_config = KernelConfig(kernel_mapping={{"{layer}": {{"{device_key}": "{repo}"}}}})\n'
        f"model = AutoModelForCausalLM.from_pretrained({name}, use_kernels=True, kernel_config=kernel_config)"
    )


def _notes(env: Env) -> list[str]:
    t = env.target
    notes = []
    if t.catalog is not None:
        notes.append(t.catalog.not_here)
        notes.append(f"the rows follow transformers' rules for {t.catalog.label} ({_describe(t)})")
    elif not t.present:
        notes.append(
            f"{t.device} is not present here: the advice follows transformers' rules for a {t.device_type} device"
        )
    if t.present and not t.live:
        notes.append(
            f"transformers in this process runs on {t.seen}: rows that depend on the {t.device_type} device are "
            "read from its rules, not built"
        )
    return notes


def _describe(t: Target) -> str:
    info = t.info
    if info is None:
        return t.device_type
    cc = info.compute_capability
    dtypes = [name for name, ok in (("bf16", info.bf16), ("fp16", info.fp16), ("tf32", info.tf32)) if ok]
    where = f"compute capability {cc}" if cc and cc[0].isdigit() else (f"arch {cc}" if cc else t.device_type)
    return f"{where}; {', '.join(dtypes) or 'no half-precision flags'}"


def _silent(env: Env, adv_default: DefaultAttention, kernels: kernel_tables.KernelsDefault) -> list[str]:
    low, high = env.kernels_range
    fallbacks = ", ".join(f"{k} -> {v}" for k, v in env.fallback.items())
    here = "kernels is usable here" if env.kernels_ok else "not here: " + env.kernels_why
    return [
        f"attn_implementation=None (the default) {adv_default.reason}",
        f"flash_attention_N without its package, but with kernels>={low},<{high}, silently downloads a Hub "
        f"kernel at load ({fallbacks}); {here}",
        f"Hub kernels outside {kernel_tables.TRUSTED_ORG}/ load only with from_pretrained(..., allow_all_kernels=True)",
        *_kernels_default_line(kernels),
    ]


def _kernels_default_line(default: kernel_tables.KernelsDefault) -> list[str]:
    if default.value is None:
        return [f"what from_pretrained does without use_kernels is unknown: {default.why}"]
    if not default.value:
        return []
    return [f"from_pretrained without use_kernels swaps layers for Hub kernels ({default.why}; on a GPU it downloads "
            "them): pass use_kernels=False or set USE_HUB_KERNELS=0 to keep each layer's own code"]  # fmt: skip


def advise(model: str | None = None, *, offline: bool = False, **arguments: Any) -> AttentionAdvice:
    """Which attn_implementation, Hub kernels and dtype will work for ``model`` on ``device``.

    ``%hw attention [MODEL] [--device DEV] [--dtype DTYPE] [--kernel ORG/REPO[:FUNC]] [--offline]`` in a notebook,
    ``python -m nbhw attention ...`` in a terminal. Without a model the advice is for the hardware alone (checked
    with nbhw's tiny Qwen3, a class that supports every implementation). Never downloads weights or kernels.
    On a GPU machine the checks run transformers' own flash-attention checks, which ask torch for the current GPU's
    compute capability, as ``from_pretrained`` does.
    """
    import transformers  # lazy: import nbhw and %load_ext nbhw stay free of transformers

    asked: AdviceArgs = checked(AdviceArgs, arguments)
    env, advice = _env(model, offline, asked)
    target, facts, chosen, wanted = env.target, env.model, env.dtype, asked.dtype
    rows = [check(key, kind, env) for key, kind in keys_and_kinds(env, asked.kernel)]
    default = _default(env)
    kernels = _kernels_advice(env, model or "MODEL")
    return AttentionAdvice(
        model=model,
        model_source=facts.source,
        model_class=facts.class_name,
        auto_class=facts.auto_class,
        device=target.device,
        device_type=target.device_type,
        present=target.present,
        live=target.live,
        seen=target.seen,
        dtype=chosen,
        dtype_given=wanted is not None,
        default=default,
        rows=rows,
        kernels=kernels,
        precision=advice,
        notes=_notes(env),
        silent=_silent(env, default, kernels.default),
        transformers=str(transformers.__version__),
        target=target.catalog.text if target.catalog else None,
        not_here=target.catalog.not_here if target.catalog else None,
    )


def _env(model: str | None, offline: bool, asked: AdviceArgs) -> tuple[Env, DtypeAdvice]:
    """What every row is judged against: the device, the model's facts, the dtype, transformers' kernel tables."""
    from transformers.utils import import_utils  # lazy: import nbhw and %load_ext nbhw stay free of transformers

    target = advice_target(asked)
    facts = model_facts(model, offline)
    advice = precision.advise(target.device, target.device_type, target.info, target.count)
    kernels_ok, kernels_why = meta_build.kernels_status()
    env = Env(
        target=target,
        model=facts,
        dtype=_resolve_dtype(asked.dtype, advice, facts),
        kernels_ok=kernels_ok,
        kernels_why=kernels_why,
        kernels_range=(import_utils.KERNELS_MIN_VERSION, import_utils.KERNELS_MAX_VERSION),
        fallback=kernel_tables.flash_kernel_fallback(rocm=target.device_type == "rocm"),
        kernel_devices=kernel_tables.flash_kernel_devices(),
    )
    return env, advice


def row_for(key: str, model: str | None = None, *, offline: bool = False, **arguments: Any) -> AttentionRow:
    """The one row ``advise(model, **arguments)`` gives for ``key``, judged alone (what ``plan.check()`` asks)."""
    asked: AdviceArgs = checked(AdviceArgs, arguments)
    env, _ = _env(model, offline, asked)
    kinds = dict(keys_and_kinds(env, asked.kernel))
    return check(key, kinds.get(key, "registry"), env)


def advice_target(asked: AdviceArgs) -> Target:
    """The device the advice is for: a catalog target, a device named here, or the best one here."""
    if asked.target is not None and asked.device is not None:
        raise UserError(
            f"--device {asked.device!r} and --target {target_word(asked.target)!r} both name the hardware to advise "
            "for; give one: --device DEV (this machine) or --target NAME (nbhw's catalog)"
        )
    found = target_of(asked.target)
    if found is not None:
        return catalog_target(found)
    return parse_device(asked.device, detect().backends)


advise.__signature__ = signature(advise, ADVICE_ARGUMENTS, keep=("model", "offline"))  # type: ignore[attr-defined]


def _resolve_dtype(wanted: str | None, advice: DtypeAdvice, facts: ModelFacts) -> str:
    if wanted is None:
        return advice.dtype
    if wanted == "auto":
        configured = getattr(facts.config, "dtype", None)
        return str(configured).removeprefix("torch.") if configured else "float32"
    return wanted


# ---------------------------------------------------------------- the advice as text and HTML


HEADERS = ("attn_implementation", "status", "checked", "why", "fix")


def _title(a: AttentionAdvice) -> str:
    what = f"{a.model} ({a.model_class}, config from {a.model_source})" if a.model else "this hardware alone"
    here = "" if a.present else " — not present here"
    found = target_of(a.target)
    if found is not None:
        here = f" of {found.label} — hardware that is not here"
    dtype = f"dtype {a.dtype}" + ("" if a.dtype_given else " (advised)")
    return f"nbhw attention: {what} on {a.device}{here}, {dtype}, transformers {a.transformers}"


def _key(row: AttentionRow) -> str:
    return f"{row.key} -> {row.resolves_to}" if row.resolves_to else row.key


def _checked(row: AttentionRow) -> str:
    return "yes" if row.checked else "no"


def _why(row: AttentionRow) -> str:
    return "; ".join([row.reason, *row.notes])


def _cells(row: AttentionRow) -> list[str]:
    return [_key(row), row.status, _checked(row), _why(row), row.fix or ""]


def _reference_line(a: AttentionAdvice) -> str | None:
    if a.model:
        return None
    return f"No model given: rows are checked with nbhw's tiny {a.model_class}, a class that supports every kind."


def _kernel_lines(a: AttentionAdvice) -> list[str]:
    k = a.kernels
    lines = [f"use_kernels=True: {'can work' if k.use_kernels else 'will not work'} here — {k.reason}"]
    said = "unknown" if k.default.value is None else str(k.default.value)
    lines.append(f"  left out of from_pretrained: use_kernels={said} — {k.default.why}")
    if k.fix:
        lines.append(f"  fix: {k.fix}")
    if k.problem:
        lines.append(f"  the default mapping could not be read: {k.problem}")
    elif k.layers:
        marked = set(k.model_layers or [])
        shown = [
            e.layer + ("*" if e.layer in marked else "") + (f" ({e.condition})" if e.condition else "")
            for e in k.layers
        ]
        lines.append(f"  default mapping for {k.device_key} ({k.source}): {', '.join(shown)}")
        lines.append(f"  * marked for Hub kernels in {a.model_class}'s code: {', '.join(k.model_layers) or 'none'}")
    else:
        lines.append(f"  the default mapping ({k.source}) has no entries for {k.device_key}")
    lines.append(f"  KernelConfig device keys: {', '.join(k.kernel_config_keys)}")
    return lines


def _dtype_lines(a: AttentionAdvice) -> list[str]:
    p = a.precision
    lines = [f"dtype for {p.device}: {p.dtype} — {p.reason}"]
    if p.tf32:
        lines.append(f"  tf32: {p.tf32}")
    lines.append(f"  training: {p.training} — {p.training_reason}")
    for launch in p.launch:
        lines.append(f"  launch: {launch}")
    lines += [f"  {n}" for n in p.notes]
    return lines


def advice_text(a: AttentionAdvice) -> str:
    """The advice for terminals: the table, then the fixes, silent behaviours, kernels and dtype."""
    rows = [[_key(r), r.status, _checked(r), _why(r)] for r in a.rows]
    out = [_title(a), ""]
    out.append(text_table(HEADERS[:4], rows, indent="  "))
    by_fix: dict[str, list[str]] = {}
    for r in a.rows:
        if r.fix:
            by_fix.setdefault(r.fix, []).append(r.key)
    fixes = [f"  {', '.join(keys)}: {fix}" for fix, keys in by_fix.items()]
    if fixes:
        out += ["", "Fixes:", *fixes]
    ref = _reference_line(a)
    out += [f"  note: {n}" for n in a.notes]
    out += ["", "What transformers does without telling you:", *[f"  - {n}" for n in a.silent]]
    if ref:
        out += ["", ref]
    out += ["", "Hub kernels (use_kernels=True):", *["  " + line for line in _kernel_lines(a)]]
    out += ["", "  " + a.kernels.example.replace("\n", "\n  ")]
    out += ["", "dtype:", *["  " + line for line in _dtype_lines(a)]]
    return "\n".join(out)


def _html_rows(a: AttentionAdvice) -> str:
    table = html_table(HEADERS, [_cells(r) for r in a.rows], css_class="nbhw-table nbhw-attention")
    # Colour the status cells: html_table escapes every cell, so mark them after the fact by exact text.
    for status in Status:
        cell = f'<td class="{status.css}" style="white-space: nowrap">{esc(status)}</td>'
        table = table.replace(f"<td>{esc(status)}</td>", cell)
    return table


def advice_html(a: AttentionAdvice) -> str:
    """The advice as an HTML fragment for Jupyter."""
    ref = _reference_line(a)
    parts = [STYLE, '<div class="nbhw nbhw-attention-advice">', f"<h3>{esc(_title(a))}</h3>"]
    parts += [f'<p class="warn">{esc(n)}</p>' for n in a.notes]
    parts.append(_html_rows(a))
    if ref:
        parts.append(f'<p class="no">{esc(ref)}</p>')
    parts.append("<h3>What transformers does without telling you</h3><ul>")
    parts += [f"<li>{esc(n)}</li>" for n in a.silent]
    parts.append("</ul><h3>Hub kernels (use_kernels=True)</h3><ul>")
    parts += [f"<li>{esc(line.strip())}</li>" for line in _kernel_lines(a)]
    parts.append(f"</ul><pre><code>{esc(a.kernels.example)}</code></pre><h3>dtype</h3><ul>")
    parts += [f"<li>{esc(line.strip())}</li>" for line in _dtype_lines(a)]
    parts.append("</ul></div>")
    return "".join(parts)
