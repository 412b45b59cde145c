"""``nbhw.detect()``: every backend row, their devices, who picks what, and the environment analysis."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nbhw.core.hardware import backends, doctor, environment, nvml, probes, who_picks
from nbhw.core.hardware.data import BackendStatus, Choice, DeviceInfo, EnvAnalysis, TorchBuild, to_plain
from nbhw.core.hardware.findings import Preflight, findings_html, findings_text
from nbhw.core.render import STYLE, Shown, esc, html_table, size, text_table, yes_no


def torch_build() -> TorchBuild:
    """The installed torch: version and what it was built for (CPU / CUDA x.y / ROCm x.y)."""
    torch = probes.torch_module()
    if torch is None:
        return TorchBuild(installed=False)
    version = getattr(torch, "version", None)
    return TorchBuild(
        installed=True,
        version=str(torch.__version__),
        build=probes.torch_build(torch),
        cuda=getattr(version, "cuda", None),
        hip=getattr(version, "hip", None),
    )


@dataclass
class Hardware(Shown):
    """What PyTorch and Transformers can use here. Renders itself as HTML in Jupyter and as text elsewhere."""

    torch: TorchBuild
    backends: list[BackendStatus]
    choices: list[Choice]
    env: EnvAnalysis
    nvidia: nvml.NvmlView = field(default_factory=lambda: nvml.NvmlView(available=False))
    preflight: Preflight | None = None  # what will fail before memory (nbhw.doctor())

    @property
    def devices(self) -> list[DeviceInfo]:
        """Every device of every usable backend."""
        return [d for b in self.backends if b.usable for d in b.devices]

    @property
    def usable(self) -> list[BackendStatus]:
        """The usable backend rows."""
        return [b for b in self.backends if b.usable]

    def backend(self, key: str) -> BackendStatus:
        """The row with this key ('cpu', 'cuda', 'rocm', 'xpu', ...)."""
        for row in self.backends:
            if row.key == key:
                return row
        raise KeyError(key)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data; the shape is documented in docs/reference/json.md (the report's JSON Schema)."""
        return {
            "torch": to_plain(self.torch),
            "nvidia": {
                "nvml": self.nvidia.available,
                "error": self.nvidia.error,
                "driver_version": self.nvidia.driver_version,
                "cuda_driver_version": self.nvidia.cuda_driver_version,
            },
            "backends": to_plain(self.backends),
            "choices": to_plain(self.choices),
            "env": to_plain(self.env),
            "preflight": self.preflight.to_dict() if self.preflight is not None else None,
        }

    def text(self) -> str:
        """The devices view as aligned text."""
        return hardware_text(self)

    def html(self) -> str:
        """The devices view as an HTML fragment."""
        return hardware_html(self)


def detect() -> Hardware:
    """Probe every backend now. Never creates a CUDA context, allocates on a device, or touches the network."""
    rows = backends.probe_all()
    view = nvml.read()
    return Hardware(
        torch=torch_build(),
        backends=rows,
        choices=who_picks.all_choices(rows),
        env=environment.analyse(view),
        nvidia=view,
        preflight=doctor.doctor(),
    )


# ---------------------------------------------------------------- the devices view as text and HTML


LABELS = {"cuda": "cuda (NVIDIA)", "rocm": "cuda (AMD ROCm)"}


def label(row: BackendStatus) -> str:
    """The backend's name in tables: its device string, with the vendor where two rows share it."""
    return LABELS.get(row.key, row.key if row.key == row.device else f"{row.device} ({row.key})")


def installed(row: BackendStatus) -> str:
    """The installed column: the version, or 'no'."""
    if not row.installed:
        return "no"
    return row.version or "yes"


def _device_cells(d: DeviceInfo) -> list[str]:
    return [
        d.device,
        d.name or "N/A",
        size(d.total_memory),
        size(d.free_memory),
        d.compute_capability or "N/A",
        yes_no(d.bf16),
        yes_no(d.fp16),
        yes_no(d.tf32),
    ]


DEVICE_HEADERS = ("device", "name", "total", "free", "capability", "bf16", "fp16", "tf32")


def hardware_text(hw: Hardware) -> str:
    """The devices view for terminals and bug reports."""
    out = [f"nbhw: accelerators here (torch {hw.torch.version or 'not installed'}, {hw.torch.build} build)", ""]
    rows = [[label(b), b.hardware, b.package, installed(b), "yes" if b.usable else "no"] for b in hw.backends]
    table = text_table(("backend", "hardware", "package", "installed", "usable"), rows, indent="  ").split("\n")
    out += table[:2]
    for line, row in zip(table[2:], hw.backends, strict=True):
        out.append(line)
        if not row.usable:
            out.append(f"      why: {row.reason}")
            if row.fix:
                out.append(f"      fix: {row.fix}")
        out.extend(f"      note: {n}" for n in row.notes)
    out += ["", "Devices"]
    out.append(text_table(DEVICE_HEADERS, [_device_cells(d) for d in hw.devices], indent="  "))
    out.extend(f"  note ({d.device}): {n}" for d in hw.devices for n in d.notes)
    out += ["", "Who picks what here"]
    out.append(text_table(("call", "device", "why"), [[c.who, c.device, c.why] for c in hw.choices], indent="  "))
    out.extend(f"  note ({c.who}): {n}" for c in hw.choices for n in c.notes)
    out += ["", "Environment"]
    out.append(
        text_table(
            ("variable", "value", "meaning"),
            [[v.name, "unset" if v.value is None else repr(v.value), v.meaning] for v in hw.env.variables],
            indent="  ",
        )
    )
    if hw.env.gpu_order:
        exact = "" if hw.env.gpu_order_exact else " (predicted)"
        out += ["", f"cuda:N ↔ nvidia-smi{exact}"]
        out.append(
            text_table(
                ("device", "nvidia-smi", "pci bus id", "name"),
                [[r.device, str(r.nvml_index), r.pci_bus_id or "N/A", r.name or "N/A"] for r in hw.env.gpu_order],
                indent="  ",
            )
        )
    if hw.env.warnings:
        out += ["", "Warnings"]
        out.extend(f"  ! {w}" for w in hw.env.warnings)
    out += _preflight_text(hw.preflight)
    return "\n".join(out)


def _preflight_text(preflight: Preflight | None) -> list[str]:
    if preflight is None:
        return []
    lines = ["", f"Pre-flight checks: {preflight.summary()}; %hw doctor shows each one"]
    return lines + findings_text(preflight.findings)[:-1]


def _status_cell(row: BackendStatus) -> str:
    if row.usable:
        return '<span class="ok">✓ usable</span>'
    parts = [f'<span class="no">✗ {esc(row.reason or "not usable")}</span>']
    if row.fix:
        parts.append(f'<div class="fix">fix: <code>{esc(row.fix)}</code></div>')
    return "".join(parts)


def _backend_rows_html(hw: Hardware) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("backend", "hardware", "package", "installed", "usable here"))
    body = []
    for row in hw.backends:
        notes = "".join(f'<div class="warn">{esc(n)}</div>' for n in row.notes)
        body.append(
            f'<tr data-backend="{esc(row.key)}"><td><code>{esc(label(row))}</code></td><td>{esc(row.hardware)}</td>'
            f"<td>{esc(row.package)}</td><td>{esc(installed(row))}</td><td>{_status_cell(row)}{notes}</td></tr>"
        )
    return (
        f'<table class="nbhw-table nbhw-backends"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    )


def _choices_html(hw: Hardware) -> str:
    """The choices table; notes and the library function each order was read from sit under the why."""
    rows = []
    for c in hw.choices:
        extra = "".join(f'<div class="sub">{esc(n)}</div>' for n in c.notes)
        if c.source:
            extra += f'<div class="src">read from <code>{esc(c.source)}</code></div>'
        rows.append(f"<tr><td><code>{esc(c.who)}</code></td><td>{esc(c.device)}</td><td>{esc(c.why)}{extra}</td></tr>")
    head = "<tr><th>call</th><th>device</th><th>why</th></tr>"
    return f'<table class="nbhw-table nbhw-choices"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def hardware_html(hw: Hardware) -> str:
    """The devices view as one self-contained HTML fragment."""
    parts = [
        STYLE,
        '<div class="nbhw nbhw-devices">',
        f"<h3>Accelerators here — torch {esc(hw.torch.version or 'not installed')} ({esc(hw.torch.build)} build)</h3>",
        _backend_rows_html(hw),
        "<h3>Devices</h3>",
        html_table(DEVICE_HEADERS, [_device_cells(d) for d in hw.devices], "nbhw-table nbhw-device-list"),
    ]
    parts += [f'<div class="warn">{esc(d.device)}: {esc(n)}</div>' for d in hw.devices for n in d.notes]
    parts += [
        "<h3>Who picks what here</h3>",
        _choices_html(hw),
    ]
    parts += [
        "<h3>Environment</h3>",
        html_table(
            ("variable", "value", "meaning"),
            [[v.name, "unset" if v.value is None else repr(v.value), v.meaning] for v in hw.env.variables],
            "nbhw-table nbhw-env",
        ),
    ]
    if hw.env.gpu_order:
        exact = "" if hw.env.gpu_order_exact else " (predicted)"
        parts += [
            f"<h3>cuda:N ↔ nvidia-smi{esc(exact)}</h3>",
            html_table(
                ("device", "nvidia-smi", "pci bus id", "name"),
                [[r.device, str(r.nvml_index), r.pci_bus_id or "N/A", r.name or "N/A"] for r in hw.env.gpu_order],
                "nbhw-table nbhw-gpu-order",
            ),
        ]
    parts += [f'<div class="warn">⚠ {esc(w)}</div>' for w in hw.env.warnings]
    if hw.preflight is not None:
        summary = f"Pre-flight checks: {hw.preflight.summary()}"
        parts += [f"<h3>{esc(summary)}</h3>", findings_html(hw.preflight.findings)]
    parts.append("</div>")
    return "".join(parts)
