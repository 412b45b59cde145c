"""nbhw's routes on a real Jupyter server: authentication, each route's shape, bad queries, Prometheus, shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import jsonschema
import psutil
import pytest
from jupyter_server.auth import Authorizer
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpclient import HTTPClientError, HTTPResponse

from nbhw.core.hardware.report import SCHEMA_PATH, report
from nbhw.server import NbhwApp
from nbhw.server import app as server_app
from tests.support.fakes import GIB, FakeGpu, NVMLError

ROUTES = ["nbhw/api/devices", "nbhw/api/memory", "nbhw/metrics"]
Fetch = Callable[..., Awaitable[HTTPResponse]]


async def get_json(jp_fetch: Fetch, route: str, **params: str) -> Any:
    response = await jp_fetch(route, params=params)
    assert response.headers["Content-Type"] == "application/json"
    return json.loads(response.body)


async def refused(jp_fetch: Fetch, route: str, **kwargs: Any) -> tuple[int, str]:
    """The status and JSON message of a request the server answers with an error."""
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch(route, **kwargs)
    response = info.value.response
    assert response is not None
    return info.value.code, json.loads(response.body)["message"]


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 15.0) -> None:
    """Wait for a condition the server reaches by itself (samples arriving)."""
    for _ in range(int(timeout / 0.1)):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("condition not reached in time")


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nbhw-sampler"]


# ---------------------------------------------------------------- authentication and authorization


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("authorization", ["", "token not-the-servers-token"])
async def test_every_route_refuses_a_request_without_the_servers_token(
    jp_fetch: Fetch, nbhw_app: NbhwApp, route: str, authorization: str
) -> None:
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch(route, headers={"Authorization": authorization})
    assert info.value.code == 403
    assert nbhw_app.sampler is None  # nothing was started for the caller


class DenyNbhw(Authorizer):
    """Allows everything but nbhw's resource, and remembers what it was asked."""

    asked: ClassVar[list[tuple[str, str]]] = []

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        DenyNbhw.asked.append((action, resource))
        return resource != "nbhw"


@pytest.fixture
def deny_nbhw(jp_server_config: Any) -> list[tuple[str, str]]:
    jp_server_config.ServerApp.authorizer_class = DenyNbhw
    DenyNbhw.asked = []
    return DenyNbhw.asked


@pytest.mark.parametrize("route", ROUTES)
async def test_the_servers_authorizer_decides_on_the_nbhw_resource(
    deny_nbhw: list[tuple[str, str]], jp_fetch: Fetch, route: str
) -> None:
    code, message = await refused(jp_fetch, route)
    assert code == 403
    assert message == "User is not authorized to read on resource: nbhw."
    assert ("read", "nbhw") in deny_nbhw
    assert (await jp_fetch("api", "status")).code == 200  # the same user, another resource


# ---------------------------------------------------------------- /nbhw/api/devices


@pytest.mark.slow
async def test_devices_is_the_report_json_of_the_servers_host_run_once_for_concurrent_requests(
    jp_fetch: Fetch, nbhw_app: NbhwApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[tuple[str, ...]] = []
    spawn = asyncio.create_subprocess_exec

    async def counted(*args: str, **kwargs: Any) -> Any:
        runs.append(args)
        return await spawn(*args, **kwargs)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", counted)
    first, second = await asyncio.gather(get_json(jp_fetch, "nbhw/api/devices"), get_json(jp_fetch, "nbhw/api/devices"))
    again = await get_json(jp_fetch, "nbhw/api/devices")  # within devices_max_age: the same report
    assert runs == [(sys.executable, "-m", "nbhw", "report", "--json")]
    assert first == second == again

    jsonschema.validate(first, json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))
    here = report().to_dict()
    assert first["platform"] == here["platform"]
    assert first["packages"] == here["packages"]
    rows = [(b["key"], b["installed"], b["usable"]) for b in first["backends"]]
    assert rows == [(b["key"], b["installed"], b["usable"]) for b in here["backends"]]


@pytest.mark.slow
@pytest.mark.parametrize("nbhw_config", [{"devices_max_age": 0.0}])
async def test_devices_max_age_zero_runs_the_report_for_every_request(
    jp_fetch: Fetch, nbhw_app: NbhwApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_app, "REPORT_COMMAND", ("-c", "import time; print(time.time_ns())"))
    first = await get_json(jp_fetch, "nbhw/api/devices")
    second = await get_json(jp_fetch, "nbhw/api/devices")
    assert isinstance(first, int) and second > first


async def test_a_report_that_fails_is_a_500_with_its_last_error_line(
    jp_fetch: Fetch, nbhw_app: NbhwApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_app, "REPORT_COMMAND", ("-c", "import sys; print('x'); sys.exit('no NVML % here')"))
    code, message = await refused(jp_fetch, "nbhw/api/devices")
    assert code == 500
    assert message == "python -m nbhw report --json exited with 1: no NVML % here"


# ---------------------------------------------------------------- /nbhw/api/memory


async def test_memory_samples_the_host_and_every_gpu_nvml_sees(
    fake_hw: Any, jp_fetch: Fetch, nbhw_app: NbhwApp
) -> None:
    fake = fake_hw.nvidia(FakeGpu(used=3 * GIB), FakeGpu(name="NVIDIA H100 80GB HBM3", used=5 * GIB, cc=(9, 0)))
    body = await get_json(jp_fetch, "nbhw/api/memory")

    assert [t["key"] for t in body["traces"]] == [
        "host rss",
        "host available",
        "host capacity",
        "gpu0 used",
        "gpu0 capacity",
        "gpu1 used",
        "gpu1 capacity",
    ]
    assert body["interval"] == 0.1 and body["window"] == 30.0 and body["running"] is True
    assert body["latest"]["gpu1 used"] == 5 * GIB and body["latest"]["gpu0 capacity"] == 80 * GIB
    assert body["latest"]["host capacity"] == psutil.virtual_memory().total
    assert body["errors"] == {}

    async def three_samples() -> bool:
        return len((await get_json(jp_fetch, "nbhw/api/memory"))["times"]) >= 3

    await until(three_samples)
    body = await get_json(jp_fetch, "nbhw/api/memory")
    assert all(len(v) == len(body["times"]) for v in body["values"].values())
    assert body["times"] == sorted(body["times"]) and body["times"][-1] <= body["now"]

    last = body["times"][-1]
    fake.gpus[0].used = 7 * GIB

    async def new_sample() -> bool:
        return bool((await get_json(jp_fetch, "nbhw/api/memory", since=repr(last)))["times"])

    await until(new_sample)
    later = await get_json(jp_fetch, "nbhw/api/memory", since=repr(last))
    assert all(t > last for t in later["times"])
    assert later["values"]["gpu0 used"][-1] == 7 * GIB
    assert (await get_json(jp_fetch, "nbhw/api/memory", since="0"))["times"][: len(body["times"])] == body["times"]


async def test_memory_lists_gpu_processes_a_vanished_pid_and_a_gpu_that_cannot_list_them(
    fake_hw: Any, jp_fetch: Fetch, nbhw_app: NbhwApp
) -> None:
    gone = 2**22 + 17  # above Linux's pid_max: no such process
    fake = fake_hw.nvidia(FakeGpu(processes=[(os.getpid(), 2 * GIB), (gone, GIB)]), FakeGpu())
    listing = fake.nvmlDeviceGetComputeRunningProcesses

    def not_on_gpu1(handle: FakeGpu) -> list[Any]:
        if handle is fake.gpus[1]:
            raise NVMLError("Not Supported")
        return listing(handle)

    fake_hw.mp.setattr(fake, "nvmlDeviceGetComputeRunningProcesses", not_on_gpu1)
    body = await get_json(jp_fetch, "nbhw/api/memory")
    assert body["processes"] == [
        {"device": "gpu0", "pid": os.getpid(), "used_memory": 2 * GIB, "kernel": None},
        {"device": "gpu0", "pid": gone, "used_memory": GIB, "kernel": None},
    ]
    assert body["process_errors"] == {"gpu1": "NVMLError: Not Supported"}


@pytest.mark.parametrize("nbhw_config", [{"per_process": False}])
async def test_per_process_off_shows_no_process_in_memory_or_metrics(
    fake_hw: Any, jp_fetch: Fetch, nbhw_app: NbhwApp
) -> None:
    fake_hw.nvidia(FakeGpu(processes=[(os.getpid(), 2 * GIB)]))
    body = await get_json(jp_fetch, "nbhw/api/memory")
    assert body["processes"] is None and body["process_errors"] == {}
    assert body["latest"]["gpu0 used"] == GIB
    text = (await jp_fetch("nbhw/metrics")).body.decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "nbhw_gpu_memory_used_bytes" in names
    assert not {"nbhw_gpu_process_memory_bytes", "nbhw_kernel_gpu_memory_bytes"} & names
    assert str(os.getpid()) not in text


BAD_SINCE = [
    "abc",
    "-1",
    "",
    "1e9",
    "1_000",
    "nan",
    "inf",
    "0x10",
    "12.",
    "1.1234567890",
    "9" * 13,
    "99999999999",  # year 5138: more than a day ahead
    "../../etc/passwd",
    "1;rm -rf /",
    "__import__('os').system('id')",
    "x" * 5000,
]


async def test_bad_since_values_get_400_with_a_message_and_start_nothing(jp_fetch: Fetch, nbhw_app: NbhwApp) -> None:
    for raw in BAD_SINCE:
        code, message = await refused(jp_fetch, "nbhw/api/memory", params={"since": raw})
        assert code == 400, raw
        assert message.startswith("since "), message
        assert len(message) < 300
    code, message = await refused(jp_fetch, "nbhw/api/memory", params=[("since", "1"), ("since", "2")])
    assert (code, message) == (400, "since may be given once; got it 2 times")
    assert nbhw_app.sampler is None
    assert (await get_json(jp_fetch, "nbhw/api/memory", since="0"))["interval"] == 0.1


# ---------------------------------------------------------------- /nbhw/metrics


async def test_metrics_parse_as_prometheus_text_with_the_figures_of_the_memory_route(
    fake_hw: Any, jp_fetch: Fetch, nbhw_app: NbhwApp
) -> None:
    fake_hw.nvidia(FakeGpu(used=3 * GIB), FakeGpu(total=24 * GIB, used=5 * GIB))
    memory = await get_json(jp_fetch, "nbhw/api/memory")
    response = await jp_fetch("nbhw/metrics")
    assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = response.body.decode()

    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) == {
        "nbhw_host_memory_available_bytes",
        "nbhw_host_memory_total_bytes",
        "nbhw_server_resident_memory_bytes",
        "nbhw_gpu_memory_used_bytes",
        "nbhw_gpu_memory_total_bytes",
        "nbhw_gpu_process_memory_bytes",
        "nbhw_kernel_gpu_memory_bytes",
    }
    for name, family in families.items():
        assert family.type == "gauge" and family.documentation, name
        assert f"# HELP {name} " in text and f"# TYPE {name} gauge" in text

    def by_device(name: str) -> dict[str, float]:
        return {s.labels["device"]: s.value for s in families[name].samples}

    assert by_device("nbhw_gpu_memory_used_bytes") == {"gpu0": 3 * GIB, "gpu1": 5 * GIB}
    assert by_device("nbhw_gpu_memory_total_bytes") == {"gpu0": 80 * GIB, "gpu1": 24 * GIB}
    assert by_device("nbhw_gpu_memory_used_bytes")["gpu0"] == memory["latest"]["gpu0 used"]
    total = families["nbhw_host_memory_total_bytes"].samples
    assert [(s.labels, s.value) for s in total] == [({}, memory["latest"]["host capacity"])]
    assert families["nbhw_gpu_process_memory_bytes"].samples == []


# ---------------------------------------------------------------- lifecycle


async def test_the_sampler_starts_on_first_request_and_stops_when_the_server_stops(
    jp_fetch: Fetch, jp_serverapp: Any, nbhw_app: NbhwApp
) -> None:
    assert nbhw_app.sampler is None and not sampler_threads()
    await get_json(jp_fetch, "nbhw/api/memory")
    await jp_fetch("nbhw/metrics")
    sampler = nbhw_app.sampler
    assert sampler is not None and sampler.running
    assert len(sampler_threads()) == 1  # both routes share it

    await jp_serverapp._cleanup()  # what the server runs when it stops

    assert not sampler.running and not sampler_threads()
    for route in ROUTES:
        assert await refused(jp_fetch, route) == (
            503,
            "the nbhw server extension has stopped (the server is shutting down)",
        )


async def test_monitoring_requests_do_not_count_as_user_activity(
    fake_hw: Any, jp_fetch: Fetch, jp_serverapp: Any, nbhw_app: NbhwApp
) -> None:
    fake_hw.nvidia(FakeGpu())
    settings = jp_serverapp.web_app.settings
    await jp_fetch("api", "contents")
    before = settings["api_last_activity"]
    await asyncio.sleep(0.01)
    await jp_fetch("nbhw/api/memory")
    await jp_fetch("nbhw/metrics")
    assert settings["api_last_activity"] == before
    await jp_fetch("api", "contents")
    assert settings["api_last_activity"] > before
