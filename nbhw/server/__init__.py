"""nbhw's Jupyter server extension: routes under <base_url>/nbhw/ over nbhw.core (see NbhwApp)."""

from __future__ import annotations

from nbhw.server.app import NbhwApp

__all__ = ["NbhwApp"]
