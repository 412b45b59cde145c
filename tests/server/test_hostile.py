"""Hostile requests to nbhw's routes on a real server: raw paths and queries, sent exactly as written.

No path or query value reaches a shell, a file path or an eval: `since` is the only value read (checked against
digits before it is a number), the report runs one fixed command, and every other path under /nbhw/ is not a
route. Malformed, oversized, repeated and encoded values get a 4xx with a short JSON message and start nothing.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest
from tornado.httpclient import HTTPResponse
from tornado.iostream import StreamClosedError

from nbhw.server import NbhwApp
from nbhw.server import app as server_app

PASSWD = "root:x:0:0"


@pytest.fixture
def raw(http_server_client: Any, jp_auth_header: dict[str, str], jp_base_url: str) -> Any:
    """GET a path and query under the server's base_url as written (no escaping), with the server's token."""

    async def fetch(path_and_query: str, **kwargs: Any) -> HTTPResponse:
        kwargs.setdefault("method", "GET")
        kwargs.setdefault("follow_redirects", False)
        response: HTTPResponse = await http_server_client.fetch(
            jp_base_url + path_and_query, headers=jp_auth_header, raise_error=False, request_timeout=20, **kwargs
        )
        return response

    return fetch


def message(response: HTTPResponse) -> str:
    text = response.body.decode("utf-8", errors="replace")
    found: str = json.loads(text)["message"]
    return found


HOSTILE_SINCE = [
    "%00",  # NUL
    "1%00",  # tornado drops control characters from arguments: the digits that are left are valid
    "%D9%A1%D9%A2",  # Arabic-Indic digits: float() would take them, the route does not
    "%EF%BC%91",  # a fullwidth 1
    "1%2E5",  # 1.5, percent-encoded: valid
    "%31",  # "1", percent-encoded: valid
    "%2D1",  # -1
    "1e3",
    "%251",  # a literal "%1"
    "%zz",  # broken percent-encoding
    "%E0%A4%A",  # truncated UTF-8
    "%FF%FE",  # not UTF-8 at all
    "1%0A2",  # a newline inside
    "%24%28id%29",  # $(id)
    "%60id%60",  # `id`
    "..%2F..%2Fetc%2Fpasswd",
    "__import__%28%22os%22%29.system%28%22id%22%29",
    "1" * 13,
    "9" * 4000,
    "since",
]


async def test_hostile_since_values_are_400_with_a_short_message_or_a_plain_number(raw: Any, nbhw_app: NbhwApp) -> None:
    for value in HOSTILE_SINCE:
        response = await raw(f"nbhw/api/memory?since={value}")
        if response.code == 200:  # only what is a number once tornado has decoded it
            assert value in {"1%00", "1%2E5", "%31"}, value
            assert "times" in json.loads(response.body)
            continue
        assert response.code == 400, (value, response.code)
        text = message(response)
        assert len(text) < 300 and "\n" not in text and "Traceback" not in text, (value, text)


async def test_bad_since_starts_no_sampler(raw: Any, nbhw_app: NbhwApp) -> None:
    for value in ("%00", "%D9%A1", "%zz", "x" * 100):
        response = await raw(f"nbhw/api/memory?since={value}")
        assert response.code == 400, value
    assert nbhw_app.sampler is None


async def test_since_repeated_a_thousand_times_is_one_400(raw: Any, nbhw_app: NbhwApp) -> None:
    response = await raw("nbhw/api/memory?" + "&".join(["since=1"] * 1000))
    assert (response.code, message(response)) == (400, "since may be given once; got it 1000 times")
    assert nbhw_app.sampler is None


async def test_a_query_larger_than_the_server_reads_is_refused_and_starts_nothing(raw: Any, nbhw_app: NbhwApp) -> None:
    try:
        response = await raw("nbhw/api/memory?since=" + "1" * 200_000)
        assert 400 <= response.code < 500, response.code
    except (StreamClosedError, ConnectionResetError):
        pass  # tornado drops a connection whose request line is over its limit: refused all the same
    assert nbhw_app.sampler is None


TRAVERSALS = [
    "nbhw/api/devices/../../../../etc/passwd",
    "nbhw/api/memory/..%2F..%2F..%2F..%2Fetc%2Fpasswd",
    "nbhw/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "nbhw/..%252F..%252Fetc%252Fpasswd",
    "nbhw//etc/passwd",
    "nbhw/api/devices%00.json",
    "nbhw/api/devices%2F",
    "nbhw/api/memory;id",
    "nbhw/api/memory%0Aid",
    "nbhw/metrics/../../../../../../etc/passwd",
    "nbhw/static/../../../etc/passwd",
    "nbhw/api/devices/x",
    "nbhw/api",
    "nbhw/",
    "nbhw/api/%24%28id%29",
]


async def test_paths_under_nbhw_that_are_not_routes_are_not_found_and_read_no_file(
    raw: Any, nbhw_app: NbhwApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[tuple[str, ...]] = []

    async def refuse(*args: str, **kwargs: Any) -> Any:
        runs.append(args)
        raise AssertionError("no subprocess for a path that is not a route")

    monkeypatch.setattr(asyncio, "create_subprocess_exec", refuse)
    for path in TRAVERSALS:
        response = await raw(path)
        assert response.code in {400, 404} or (response.code in {301, 302} and path.endswith("/")), (
            path,
            response.code,
        )
        assert PASSWD not in response.body.decode("utf-8", errors="replace"), path
    assert runs == [] and nbhw_app.sampler is None


async def test_query_values_never_reach_the_report_command(
    raw: Any, nbhw_app: NbhwApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[tuple[str, ...]] = []
    spawn = asyncio.create_subprocess_exec

    async def counted(*args: str, **kwargs: Any) -> Any:
        runs.append(args)
        assert kwargs["cwd"] == server_app.PACKAGE_PARENT and "shell" not in kwargs
        return await spawn(*args, **kwargs)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", counted)
    # The report itself is a stand-in: what is checked is the command line.
    monkeypatch.setattr(server_app, "REPORT_COMMAND", ("-c", "print('{}')"))
    response = await raw("nbhw/api/devices?cmd=%24%28id%29&since=%3Bid&path=..%2F..%2Fetc%2Fpasswd&x=%00")
    assert response.code == 200 and json.loads(response.body) == {}
    assert runs == [(sys.executable, "-c", "print('{}')")]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize("route", ["nbhw/api/devices", "nbhw/api/memory", "nbhw/metrics"])
async def test_only_get_is_answered(raw: Any, nbhw_app: NbhwApp, method: str, route: str) -> None:
    body = None if method == "DELETE" else b'{"since": "1"}'
    response = await raw(route, method=method, body=body, allow_nonstandard_methods=True)
    assert response.code in {403, 405}, (method, route, response.code)  # 403: the server's XSRF check comes first
    assert nbhw_app.sampler is None
