"""HTTP routes over the extension app: every one requires the server's authentication and authorization."""

from __future__ import annotations

import json
import re
import time
from typing import Any, Protocol, cast

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web

from nbhw.server.metrics import CONTENT_TYPE

# The resource an Authorizer (JupyterHub's scopes, a custom ServerApp.authorizer_class) is asked about.
AUTH_RESOURCE = "nbhw"
# A Unix time in seconds, as the memory route's `times` are: digits, optionally a fraction.
SINCE = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?")
# How far ahead of the server's clock `since` may be (a client's clock may run a little fast).
SINCE_AHEAD = 86400.0


class Stopped(Exception):
    """The extension was stopped (the server is shutting down): the routes answer 503."""


class ReportFailed(Exception):
    """`python -m nbhw report --json` did not give a report: the devices route answers 500."""


class Answers(Protocol):
    """What the routes ask of the extension app (nbhw.server.app.NbhwApp)."""

    async def devices_body(self) -> str: ...

    async def memory_body(self, since: float | None) -> dict[str, Any]: ...

    async def metrics_body(self) -> bytes: ...


def shown(value: str, width: int = 40) -> str:
    """A query value quoted for an error message, shortened."""
    return repr(value if len(value) <= width else value[: width - 1] + "…")


def parse_since(values: list[str], now: float) -> float | None:
    """The `since` query argument as a Unix time; ValueError with the message for the client otherwise."""
    if not values:
        return None
    if len(values) > 1:
        raise ValueError(f"since may be given once; got it {len(values)} times")
    raw = values[0]
    if not SINCE.fullmatch(raw):
        raise ValueError(
            f"since must be a Unix time in seconds such as {now:.3f} (digits, optionally a fraction), "
            f"for example the last of the `times` this route returned; got {shown(raw)}"
        )
    value = float(raw)
    if value > now + SINCE_AHEAD:
        raise ValueError(f"since {raw} is more than a day after the server's clock ({now:.3f})")
    return value


class NbhwHandler(ExtensionHandlerMixin, APIHandler):
    """Common to nbhw's routes: the app, JSON errors, and no activity tracking."""

    auth_resource = AUTH_RESOURCE
    # A Prometheus scrape or a graph polling is not a user at work: it must not keep an idle server from being culled.
    _track_activity = False

    @property
    def nbhw(self) -> Answers:
        """The extension app."""
        return cast(Answers, self.extensionapp)

    def fail(self, status: int, message: str) -> None:
        """Answer with a status and a JSON ``{"message": ...}`` (the message never goes through %-formatting)."""
        self.set_status(status)
        self.finish(json.dumps({"message": message}))


class DevicesHandler(NbhwHandler):
    """GET /nbhw/api/devices: `python -m nbhw report --json` for the server's host."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        try:
            text = await self.nbhw.devices_body()
        except Stopped as exc:
            self.fail(503, str(exc))
            return
        except ReportFailed as exc:
            self.log.warning("nbhw: %s", exc)
            self.fail(500, str(exc))
            return
        self.finish(text)


class MemoryHandler(NbhwHandler):
    """GET /nbhw/api/memory?since=T: samples of host and GPU memory, and who holds GPU memory."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        try:
            since = parse_since(self.get_query_arguments("since"), time.time())
        except ValueError as exc:
            self.fail(400, str(exc))
            return
        try:
            body = await self.nbhw.memory_body(since)
        except Stopped as exc:
            self.fail(503, str(exc))
            return
        self.finish(json.dumps(body))


class MetricsHandler(NbhwHandler):
    """GET /nbhw/metrics: the same figures in the Prometheus text format."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        try:
            body = await self.nbhw.metrics_body()
        except Stopped as exc:
            self.fail(503, str(exc))
            return
        self.finish(body, set_content_type=CONTENT_TYPE)


def routes() -> list[tuple[str, Any]]:
    """URL patterns (the extension app puts the server's base_url in front) and their handlers."""
    return [
        (r"/nbhw/api/devices", DevicesHandler),
        (r"/nbhw/api/memory", MemoryHandler),
        (r"/nbhw/metrics", MetricsHandler),
    ]
