"""What this machine has: backends, probes, NVML, device visibility, who picks what, detection, the report, and
the pre-flight checks of the installed binaries (nbhw.doctor()).

The documented vendor entry point ``nbhw.core.hardware.Probed`` (what a backend's ``probe()`` returns) is
re-exported here from :mod:`nbhw.core.hardware.data`.
"""

from nbhw.core.hardware.data import BackendStatus, DeviceInfo, Probed

__all__ = ["BackendStatus", "DeviceInfo", "Probed"]
