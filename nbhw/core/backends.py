"""The documented vendor entry point ``nbhw.core.backends.Backend``, kept working: the registry lives in
:mod:`nbhw.core.hardware.backends`."""

from nbhw.core.hardware.backends import Backend

__all__ = ["Backend"]
