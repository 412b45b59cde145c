"""The pre-flight checks' plain data: what they compare (torch, the GPUs), what they found, and the result.

Every :class:`Finding` says what will fail, when (``import``, ``load`` i.e. ``from_pretrained``, or ``first
forward``), and the exact command that fixes it. Its ``id`` is stable (``"<subject>:<kind>"``); ``applies_to``
names the plan options that load what it is about (any one of them) and ``device`` the GPU it is about (then only a
plan using that device hits it), so a plan can attach it as a warning to the cell that would
(:meth:`Preflight.for_plan`).
"""

from __future__ import annotations

import platform
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from packaging.version import InvalidVersion, Version

from nbhw.core.hardware.data import to_plain
from nbhw.core.render import STYLE, Shown, esc, html_table, text_table

Severity = Literal["error", "warning"]
When = Literal["import", "load", "first forward"]
Status = Literal["ok", "finding", "skipped", "unknown"]


@dataclass(frozen=True)
class Trigger:
    """A plan option that loads what a finding is about: ('attn_implementation', 'flash_attention_2')."""

    option: str
    value: str

    def words(self) -> str:
        """How the option reads in a from_pretrained cell."""
        if self.option == "use_kernels":
            return "use_kernels=True"
        if self.option == "kernel":
            return f"the Hub kernel {self.value}"
        return f"{self.option}={self.value!r}"


@dataclass(frozen=True)
class Finding:
    """One thing that will fail, when, and the command that fixes it."""

    id: str
    package: str
    severity: Severity
    what: str
    when: When
    fix: str
    evidence: tuple[str, ...] = ()
    applies_to: tuple[Trigger, ...] = ()  # any of these options loads it; () = whatever the cell asks for
    device: str | None = None  # the GPU it is about ('cuda:0'); None: every device

    def hits(self, options: set[Trigger], devices: set[str]) -> bool:
        """Whether a cell with these options, placed on these devices, would hit it."""
        loads = not self.applies_to or bool(options.intersection(self.applies_to))
        return loads and (self.device is None or self.device in devices)

    def where(self) -> str:
        """The cells that hit it, in their own words."""
        options = " or ".join(t.words() for t in self.applies_to)
        on = f"layers on {self.device}" if self.device else ""
        return " with ".join(p for p in (options, on) if p) or "any from_pretrained"

    def line(self) -> str:
        """One line for a plan's notes: the finding, when it fails, and the fix."""
        return f"pre-flight {self.severity} ({self.id}), at {self.when}: {self.what}; fix: {self.fix}"


@dataclass(frozen=True)
class Check:
    """What one check looked at: 'ok', 'finding', 'skipped' (nothing to check) or 'unknown' (could not tell)."""

    name: str
    status: Status
    detail: str


@dataclass(frozen=True)
class Gpu:
    """A GPU this process would use: 'cuda:0', its name, NVIDIA compute capability or AMD gfx target."""

    device: str
    name: str | None = None
    capability: tuple[int, int] | None = None
    gfx: str | None = None


@dataclass(frozen=True)
class TorchFacts:
    """The installed torch as the checks need it; every field read without a CUDA call."""

    version: str
    cuda: str | None = None
    hip: str | None = None
    xpu: str | None = None
    cxx11_abi: bool | None = None
    arch_list: tuple[str, ...] = ()
    arch_source: str = ""
    lib_dir: Path | None = None
    loaded_sonames: frozenset[str] = frozenset()
    companions: tuple[tuple[str, str], ...] = ()  # (distribution, version) built against this torch
    driver_cuda: str | None = None

    @property
    def base_version(self) -> str:
        """'2.13.0' for '2.13.0+cu128'."""
        try:
            return Version(self.version).base_version
        except InvalidVersion:
            return self.version.split("+")[0]


@dataclass(frozen=True)
class System:
    """Everything the checks compare against: torch, the GPUs, the platform."""

    torch: TorchFacts
    gpus: tuple[Gpu, ...] = ()
    machine: str = field(default_factory=platform.machine)
    os: str = field(default_factory=lambda: platform.system().lower())


# ---------------------------------------------------------------- the result


def _plan_triggers(
    attn_implementation: str | None,
    quantization: str | None,
    use_kernels: bool,
    kernels: Iterable[str],
) -> set[Trigger]:
    wanted: set[Trigger] = set()
    if attn_implementation:
        wanted.add(Trigger("attn_implementation", attn_implementation.removeprefix("paged|")))
    if quantization:
        wanted.add(Trigger("quantization", quantization))
    if use_kernels:
        wanted.add(Trigger("use_kernels", "True"))
    return wanted | {Trigger("kernel", re.split(r"[@:]", k, maxsplit=1)[0]) for k in kernels}


@dataclass
class Preflight(Shown):
    """``nbhw.doctor()``'s answer: the findings first, then what each check looked at."""

    findings: list[Finding]
    checks: list[Check]
    seconds: float

    @property
    def errors(self) -> list[Finding]:
        """The findings that make something fail (the others are warnings)."""
        return [f for f in self.findings if f.severity == "error"]

    def for_plan(
        self,
        *,
        devices: Iterable[str] = (),
        attn_implementation: str | None = None,
        quantization: str | None = None,
        use_kernels: bool = False,
        kernels: Iterable[str] = (),
    ) -> list[Finding]:
        """The findings a from_pretrained cell with these options would hit.

        ``quantization`` is transformers' method name (``bitsandbytes_4bit``); ``kernels`` are Hub kernel ids.
        """
        wanted = _plan_triggers(attn_implementation, quantization, use_kernels, kernels)
        used = set(devices)
        return [f for f in self.findings if f.hits(wanted, used)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: findings, checks, seconds (the report's ``preflight``)."""
        return {
            "findings": to_plain(self.findings),
            "checks": to_plain(self.checks),
            "seconds": round(self.seconds, 4),
        }

    def summary(self) -> str:
        """One line: how many findings, or that nothing will fail before memory."""
        if not self.findings:
            return f"nothing will fail before memory ({len(self.checks)} checks)"
        errors = len(self.errors)
        warnings = len(self.findings) - errors
        parts = [f"{n} {word}{'s' if n > 1 else ''}" for n, word in ((errors, "error"), (warnings, "warning")) if n]
        return " and ".join(parts) + " before memory"

    def text(self) -> str:
        """``%hw doctor`` in a terminal: the findings with their fix, then the checks."""
        lines = [f"nbhw doctor: pre-flight checks of the installed binaries: {self.summary()}", ""]
        lines += findings_text(self.findings)
        rows = [[c.name, c.status, c.detail] for c in self.checks]
        lines += ["Checks", text_table(("check", "status", "detail"), rows, "  "), ""]
        lines.append(
            f"{self.seconds:.2f} s of checks; no CUDA context created, flash-attn and bitsandbytes not imported"
        )
        return "\n".join(lines)

    def html(self) -> str:
        """The same as an HTML fragment."""
        rows = [[c.name, c.status, c.detail] for c in self.checks]
        return (
            f'{STYLE}<div class="nbhw nbhw-doctor"><h3>Pre-flight checks: {esc(self.summary())}</h3>'
            f"{findings_html(self.findings)}<h3>Checks</h3>"
            f"{html_table(('check', 'status', 'detail'), rows, 'nbhw-table nbhw-checks')}</div>"
        )


def findings_text(findings: Iterable[Finding]) -> list[str]:
    """Each finding as a few indented lines: what, when, fix, the plan options that hit it, what was seen."""
    lines: list[str] = []
    for f in findings:
        mark = "✗" if f.severity == "error" else "!"
        lines += [f"  {mark} {f.id} ({f.severity}, fails at {f.when})", f"      {f.what}", f"      fix: {f.fix}"]
        lines.append(f"      hits a cell with: {f.where()}")
        lines += [f"      seen: {e}" for e in f.evidence]
        lines.append("")
    return lines


def findings_html(findings: Iterable[Finding]) -> str:
    """The findings as a table: severity, what fails and when, the fix as code."""
    rows = []
    for f in findings:
        css = "bad" if f.severity == "error" else "warn"
        seen = "".join(f'<div class="sub">{esc(e)}</div>' for e in f.evidence)
        hits = f.where()
        rows.append(
            f'<tr data-finding="{esc(f.id)}"><td><span class="{css}">{esc(f.severity)}</span></td>'
            f"<td><code>{esc(f.id)}</code></td><td>{esc(f.what)}{seen}</td><td>{esc(f.when)}</td>"
            f'<td><div class="fix"><code>{esc(f.fix)}</code></div>'
            + (f'<div class="sub">hits: {esc(hits)}</div>' if hits else "")
            + "</td></tr>"
        )
    if not rows:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ("severity", "finding", "what will fail", "when", "fix"))
    body = "".join(rows)
    return f'<table class="nbhw-table nbhw-findings"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
