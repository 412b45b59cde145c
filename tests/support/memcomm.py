"""A comm stand-in that records what widgets send (as ipywidgets' own tests do), for tests and the benchmark."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar


class RecordingComm:
    """Records every message a widget sends instead of sending it to a front end."""

    kernel = "Truthy"
    every: ClassVar[list[RecordingComm]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.comm_id = uuid.uuid4().hex
        self.opened = kwargs
        self.messages: list[tuple[dict[str, Any], list[Any]]] = []
        self.closed = False
        RecordingComm.every.append(self)

    def open(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_msg(self, callback: Any) -> None:
        self.callback = callback

    def send(self, data: Any = None, metadata: Any = None, buffers: Any = None) -> None:
        self.messages.append((data, list(buffers or [])))

    def close(self, *args: Any, **kwargs: Any) -> None:
        self.closed = True


def open_widgets() -> int:
    """How many widgets are open in this process (each holds a comm and a model in the browser until closed)."""
    import warnings

    import ipywidgets

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Widget.widgets: deprecated, still the registry
        return len(ipywidgets.Widget.widgets)


def message_bytes(data: dict[str, Any], buffers: list[Any]) -> int:
    """What a message costs on the wire: its JSON plus its binary buffers."""
    return len(json.dumps(data, default=str)) + sum(memoryview(b).nbytes for b in buffers)


# plotly's FigureWidget numbers its edits; these counters gain a byte at every power of ten.
EDIT_COUNTERS = frozenset({"_last_trace_edit_id", "_last_layout_edit_id", "trace_edit_id", "layout_edit_id"})


def counter_bytes(messages: list[tuple[dict[str, Any], list[Any]]]) -> int:
    """The bytes plotly's edit counters take in these messages (the only part of a tick that grows, by digits)."""

    def walk(value: Any) -> int:
        if isinstance(value, dict):
            return sum(len(str(v)) if k in EDIT_COUNTERS and isinstance(v, int) else walk(v) for k, v in value.items())
        if isinstance(value, list):
            return sum(walk(v) for v in value)
        return 0

    return sum(walk(data) for data, _ in messages)


class Recorder:
    """Counts the messages and bytes sent by every widget made while it records."""

    def __init__(self) -> None:
        self.start = len(RecordingComm.every)
        self.marks: list[int] = []

    def comms(self) -> list[RecordingComm]:
        return RecordingComm.every[self.start :]

    def messages(self) -> list[tuple[dict[str, Any], list[Any]]]:
        return [m for c in self.comms() for m in c.messages]

    def total(self) -> int:
        return sum(message_bytes(d, b) for d, b in self.messages())

    def count(self) -> int:
        return len(self.messages())

    def drain(self) -> tuple[int, int, list[tuple[dict[str, Any], list[Any]]]]:
        """(messages, bytes, the messages) sent since the last drain; forgets them."""
        sent = self.messages()
        for c in self.comms():
            c.messages.clear()
        return len(sent), sum(message_bytes(d, b) for d, b in sent), sent


@contextmanager
def recording_comms() -> Iterator[Recorder]:
    """Patch comm creation so widgets record their messages instead of needing a kernel."""
    import comm

    original = comm.create_comm
    comm.create_comm = RecordingComm
    try:
        yield Recorder()
    finally:
        comm.create_comm = original
