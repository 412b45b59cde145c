"""Bad input costs nothing: property-based lines to every %hw subcommand (real IPython shell) and to the CLI.

Every line is either valid and works, or ends in one one-line ``UsageError`` (the CLI: exit 2 and one ``error:``
line) with nothing printed or displayed, no nbhw thread and no widget left behind. Hypothesis mixes the words a
person gets wrong (unknown options, stray quotes, sizes like ``80GB!``, devices like ``cuda:x``, unknown dtypes and
attention keys, paths that don't exist, ids with quotes, newlines and unicode) with valid ones, so that both
outcomes are reached. The Hub is offline (HF_HUB_OFFLINE=1): a Hub id that is not cached fails fast.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

from nbhw import commands
from nbhw.__main__ import main
from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.ui import panel as panels
from tests.support.memcomm import open_widgets

EXAMPLES = 160
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # with the fixed seeds below: the same lines on every run and in CI
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ---------------------------------------------------------------- the words people get wrong

BAD_SIZES = ["80GB!", "lots", "-1GB", "1e400GB", "nanGB", "infGiB", "0x10GB", "GB", "1.5.5GB", "80 GB", "", "=", "½GB"]
GOOD_SIZES = ["70GiB", "500MB", "1GB", "1024", "3GiB"]
BAD_DEVICES = ["cuda:x", "gpu", "cuda:-1", "cuda:99999999999999999999", "cuda:", ":0", "cuda:0:1", "CUDA", "meta",
               "mps:1", "cpu:0", "npu:0", "GPU0", "cuda 0", "cu\nda", "cüda"]  # fmt: skip
GOOD_DEVICES = ["cpu", "cuda", "cuda:0", "mps", "xpu:0"]
DTYPES = ["int8", "bf16", "Float32", "uint8", "bool", "complex64", "torch.int4", "float16", "bfloat16", "auto", "half",
          "float32", "torch.float16", "float8_e4m3fn", "fp16", ""]  # fmt: skip
ATTNS = ["bogus", "sdpa", "eager", "flash_attention_9", "paged|", "paged|sdpa", "paged|bogus", "org/repo",
         "org/repo:fn", "org/repo@v1:fn", "kernels-community/flash-attn2", "a/b/c", "/abs", "flash_attention_2",
         "flex_attention", "SDPA", "sdpa;rm -rf /"]  # fmt: skip
KERNELS = ["org/repo", "org/repo:func", "org/repo@main", "a b", "org", "org/", "/repo", "org/re po", "org/repo:",
           "kernels-community/flash-attn2", "org/repo\n:x"]  # fmt: skip
DEVICE_MAPS = ["auto", "balanced", "balanced_low_0", "sequential", "none", "None", "0", "-1", "cpu", "disk",
               '{"": "cpu"}', '{"": 0}', "{}", '{"": "gpu"}', '{"a": {"b": 1}}', "{1: 2}", '{"": -3}', "{",
               '{"": True}', "{'': 99999999999999999999}", "{" + "[" * 300, "(" * 150 + ")" * 150,
               '{"": ' + "-" * 5000 + "1}", "__import__('os').system('echo pwned')", "1e9", "99999999999999999999",
               "cuda:x", "gpu"]  # fmt: skip
NUMBERS = ["0.5", "1", "0", "-2", "x", "nan", "inf", "-inf", "1e400", "1e-300", "0.01", "3600", "3601", "1e9", "0.05",
           "80GB!", "1_000", "٣", "0x10", " 1"]  # fmt: skip
MISSING = ["./nope", "/does/not/exist", "~/nope-nbhw", "../../etc/passwd", "C:\\models\\x", "./a b/c", "nope/"]
ODD_IDS = ['a"b/c', "org/na'me", "org/na\nme", "ünï/cödé", "org/" + "x" * 200, "a/b/c", "org//x", "-x", "--",
           "org/x\x00", "org/x y", "org/😀", "'", '"', "\\", "$(id)", "`id`", ";", "|", "org/x;ls",
           "🤗/model"]  # fmt: skip
TARGETS = ["T4", "2x H100", "2 x H100-80GB", "2×RTX4090", "rtx-4090", "4x A100-40GB", "8x MI300X", "Gaudi 2",
           "64x T4", "H1000", "0x H100", "3.5x A100", "65x H100", "-1x T4", "A100", "M3 Max", "2x M3 Max 128GB", "",
           "x", "2x", "MI300"]  # fmt: skip
TARGET_LIKE = r"([0-9.-]{0,3} ?[x×*]? ?)?[A-Za-z]{0,6}[ -]?[0-9]{0,4}(GB)?"
FILES = ["/etc/hostname", "/dev/null", __file__]
HUB_UNCACHED = ["nbhw-test/not-cached", "org/uncached-model", "gpt2-nbhw-not-here"]
QUOTES = ['"', "'", '"unbalanced', "'a b'", '"a\\"b"', "\\", '""', "''"]
UNKNOWN_OPTIONS = st.from_regex(r"--?[a-z][a-z_-]{0,10}", fullmatch=True)
RANDOM_WORDS = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)


def either(fixed: list[str], pattern: str) -> st.SearchStrategy[str]:
    """One of the listed words, or a word matching ``pattern`` (the near misses a list can't hold)."""
    return st.one_of(st.sampled_from(fixed), st.from_regex(pattern, fullmatch=True))


def literals() -> st.SearchStrategy[str]:
    """Python-literal-like text for --device-map: dicts and lists of devices, numbers, None, nesting."""
    leaves = st.sampled_from(['""', '"cpu"', '"disk"', '"cuda:0"', '"gpu"', "0", "-1", "1e400", "None", "True", "1j",
                              "[1]", "{}", "b'x'", '"model.layers.0"', "99999999999999999999"])  # fmt: skip
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
            st.lists(st.tuples(inner, inner), max_size=3).map(
                lambda kv: "{" + ", ".join(f"{k}: {v}" for k, v in kv) + "}"
            ),
        ),
        max_leaves=8,
    )


SIZES = either(GOOD_SIZES + BAD_SIZES, r"[-+]?[0-9_.]{0,6}(e[-+]?[0-9]{1,3})? ?([KMGTPkmgtp]i?)?[Bb]?[!?]?")
DEVICE_LIKE = r"[a-zA-Z]{0,6}:?-?[0-9x]{0,3}"


def tiny() -> str:
    return str(tiny_model_path())


def models() -> st.SearchStrategy[str]:
    """A model argument: the tiny local model, an uncached Hub id, or a path / id that is a mistake."""
    return st.one_of(
        st.just("TINY"),
        st.sampled_from(HUB_UNCACHED),
        st.sampled_from(MISSING + ODD_IDS + FILES),
        RANDOM_WORDS,
    )


def noise() -> st.SearchStrategy[list[str]]:
    """Words that belong to no subcommand."""
    return st.lists(
        st.one_of(UNKNOWN_OPTIONS, RANDOM_WORDS, st.sampled_from(QUOTES), st.sampled_from(BAD_SIZES + BAD_DEVICES)),
        max_size=2,
    )


def option(name: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.tuples(st.just(name), values).map(list)


def optional(*choices: st.SearchStrategy[list[str]]) -> st.SearchStrategy[list[str]]:
    """Zero or more of these option groups, in any order."""
    return st.lists(st.one_of(*choices), max_size=3).map(lambda groups: [w for g in groups for w in g])


SUBCOMMAND_WORDS: dict[str, st.SearchStrategy[list[str]]] = {
    "devices": optional(st.just(["--json"])),
    "report": optional(st.just(["--json"])),
    "doctor": optional(st.just(["--json"])),
    "memory": optional(
        option("--interval", either(NUMBERS, r"[-+]?[0-9_.]{0,6}(e[-+]?[0-9]{1,3})?")),
        option("--window", either(NUMBERS, r"[-+]?[0-9_.]{0,6}(e[-+]?[0-9]{1,3})?")),
        st.just(["--stop"]),
    ),
    "attention": st.tuples(
        st.one_of(st.just([]), models().map(lambda m: [m])),
        optional(
            option("--device", either(BAD_DEVICES + GOOD_DEVICES, DEVICE_LIKE)),
            option("--dtype", st.one_of(st.sampled_from(DTYPES), RANDOM_WORDS)),
            option("--kernel", either(KERNELS, r"[A-Za-z0-9_./:@ -]{0,24}")),
            option("--target", either(TARGETS, TARGET_LIKE)),
            st.just(["--offline"]),
            st.just(["--json"]),
        ),
    ).map(lambda t: t[0] + t[1]),
    "quantization": st.tuples(
        st.one_of(st.just([]), models().map(lambda m: [m])),
        optional(
            option("--target", either(TARGETS, TARGET_LIKE)),
            option("--dtype", st.one_of(st.sampled_from(DTYPES), RANDOM_WORDS)),
            st.just(["--offline"]),
            st.just(["--json"]),
        ),
    ).map(lambda t: t[0] + t[1]),
    "targets": optional(
        option("--vendor", either(["AMD", "nvidia", "Apple", "acme", ""], r"[A-Za-z]{0,8}")), st.just(["--json"])
    ),
    "holders": optional(
        option("--device", either(BAD_DEVICES + GOOD_DEVICES, DEVICE_LIKE)),
        st.just(["--json"]),
    ),
}
# Variable names a person gets wrong: unknown, IPython's own, output history, a module, not identifiers.
FREE_NAMES = ["nope", "Out", "In", "_", "__", "_1", "_oh", "get_ipython", "exit", "torch", "", "a b", "-x", "1x",
              "__builtins__", "modle", "ünï"]  # fmt: skip
FREE_SWITCHES = st.sampled_from([["--history"], ["--traceback"], ["--cache"], ["--json"]])
# A free line, even a mistaken one, walks what the session holds (to name the variables that hold tensors): fewer.
FEWER = {"free": 80}
SUBCOMMAND_WORDS["free"] = st.tuples(
    # No name (then a switch makes the line valid) half the time: this shell holds no tensor a name could free.
    st.one_of(st.just([]), st.lists(either(FREE_NAMES, r"[A-Za-z_][A-Za-z0-9_]{0,8}"), min_size=1, max_size=2)),
    st.lists(FREE_SWITCHES, max_size=3).map(lambda groups: [w for g in groups for w in g]),
).map(lambda t: [*t[0], *t[1]])


def load_words(last: list[str]) -> st.SearchStrategy[list[str]]:
    return st.tuples(
        st.one_of(st.just([]), models().map(lambda m: [m])),
        optional(
            option("--device-map", st.one_of(either(DEVICE_MAPS + BAD_DEVICES, DEVICE_LIKE), literals())),
            option("--dtype", st.one_of(st.sampled_from(DTYPES), RANDOM_WORDS)),
            option("--attn", either(ATTNS, r"(paged\|)?[a-z_/:@-]{0,20}")),
            st.just(["--kernels"]),
            option("--quantize", st.sampled_from(["4bit", "8bit", "2bit", "4BIT", "", "quanto", "awq", "hqq"])),
            option("--target", either(TARGETS, TARGET_LIKE)),  # with --max-memory too: a one-line conflict
            st.tuples(
                st.just("--max-memory"),
                st.lists(
                    st.tuples(
                        either(["0", "1", "cpu", "disk", "mps", "gpu", "-1", "cuda:0", "", "x"], DEVICE_LIKE),
                        SIZES,
                    ).map("=".join)
                    | st.sampled_from(["0", "cpu", "0==1GB", "=1GB"]),
                    min_size=1,
                    max_size=3,
                ),
            ).map(lambda t: [t[0], *t[1]]),
            st.just(["--offline"]),
        ),
        st.just(last),
    ).map(lambda t: t[0] + t[1] + t[2])


SUBCOMMAND_WORDS["load"] = load_words([])
SUBCOMMAND_WORDS["load --emit"] = load_words(["--emit"])
CLI_WORDS = {
    "devices": SUBCOMMAND_WORDS["devices"],
    "report": SUBCOMMAND_WORDS["report"],
    "doctor": SUBCOMMAND_WORDS["doctor"],
    "attention": SUBCOMMAND_WORDS["attention"],
    "quantization": SUBCOMMAND_WORDS["quantization"],
    "targets": SUBCOMMAND_WORDS["targets"],
    "plan": load_words([]).flatmap(lambda ws: st.sampled_from([ws, [*ws, "--json"]])),
}


def argv_for(command: str, valid: list[str], extra: list[str], mix: int) -> list[str]:
    """The subcommand, its words, and (for mix > 0) noise put at the end or the front."""
    head = command.split()
    words_ = [tiny() if w == "TINY" else w for w in valid]
    if mix == 1:
        return [*head[:1], *words_, *head[1:], *extra]
    if mix == 2:
        return [*extra, *head[:1], *words_, *head[1:]]
    return [*head[:1], *words_, *head[1:]]


def line_for(argv: list[str], quoting: int) -> str:
    """A magic line: quoted as a shell would need it, or joined raw (stray quotes stay stray)."""
    return shlex.join(argv) if quoting else " ".join(argv)


# ---------------------------------------------------------------- the shell


def nbhw_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("nbhw") and t.is_alive())


@pytest.fixture
def shell(ip: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The real IPython shell with nbhw loaded, the Hub offline, and every display recorded."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    shown: list[dict[str, Any]] = []
    monkeypatch.setattr(ip.display_pub, "publish", lambda data, *a, **k: shown.append(data))
    monkeypatch.setattr(ip, "set_next_input", lambda text, replace=False: shown.append({"next_input": text}))
    ip.shown = shown
    tiny()  # built once, before the first example
    ip.run_line_magic("load_ext", "nbhw")
    # The heap this test did not make (torch, transformers, IPython, the tests before it) set aside: every %hw free
    # line runs gc.collect() and %hw holders walks every live tensor, which cost with the process's whole heap
    # (2 s a line after a few test files). What the lines make, and every tensor below, is still collected and
    # walked; nbhw's walk from the namespace reads set-aside objects as any others.
    gc.freeze()
    try:
        yield ip
    finally:
        gc.unfreeze()
        del ip.shown


def run_line(shell: Any, line: str, capsys: pytest.CaptureFixture[str]) -> str:
    """Run one %hw line; 'ok' or 'usage', asserting that a mistake cost nothing."""
    capsys.readouterr()
    shell.shown.clear()
    threads, widgets = nbhw_threads(), open_widgets()
    try:
        shell.run_line_magic("hw", line)
    except UsageError as exc:
        message = str(exc)
        out = capsys.readouterr()
        assert message and "\n" not in message and "Traceback" not in message, (line, message)
        assert out.out == "" and out.err == "", (line, out)
        assert shell.shown == [], (line, "a failing line displayed something")
        assert nbhw_threads() == threads, (line, "a failing line left a thread")
        assert open_widgets() == widgets, (line, "a failing line left widgets open")
        return "usage"
    out = capsys.readouterr()
    assert out.out or shell.shown, (line, "a valid line showed nothing")
    return "ok"


def clean_up(shell: Any, widgets: int) -> None:
    """Unload (closes panels and graphs, stops threads) and load again; nothing may be left."""
    worker = panels._workers[0] if panels._workers else None
    if worker is not None:
        worker.wait(120)
    shell.run_line_magic("unload_ext", "nbhw")
    assert nbhw_threads() == [], "a thread outlived %unload_ext nbhw"
    assert open_widgets() == widgets, f"{open_widgets() - widgets} widgets left open after %unload_ext nbhw"
    shell.run_line_magic("load_ext", "nbhw")


def fuzz_magic(shell: Any, capsys: pytest.CaptureFixture[str], line: str) -> str:
    widgets = open_widgets()
    outcome = run_line(shell, line, capsys)
    if outcome == "ok":
        clean_up(shell, widgets)
    return outcome


def report(what: str, seen: Counter[str], *, least_ok: int, least_usage: int, examples: int = EXAMPLES) -> None:
    """Print the figures and check that both outcomes were reached (the lines were not all of one kind)."""
    print(f"\n{what}: {sum(seen.values())} lines, {seen['ok']} valid, {seen['usage']} usage errors")
    assert sum(seen.values()) >= examples * 0.9, seen
    assert seen["ok"] >= least_ok and seen["usage"] >= least_usage, seen


@pytest.mark.slow
@pytest.mark.parametrize("command", list(SUBCOMMAND_WORDS))
def test_every_hw_line_is_valid_or_a_one_line_usage_error(
    shell: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    seen: Counter[str] = Counter()
    examples = FEWER.get(command, EXAMPLES)

    @settings(SETTINGS, max_examples=examples)
    @seed(zlib.crc32(command.encode()))
    @given(data=st.data())
    def lines(data: st.DataObject) -> None:
        # Half the lines as under a Jupyter front end (widgets and HTML), half as in a terminal.
        jupyter = data.draw(st.booleans(), label="jupyter")
        monkeypatch.setattr(shell, "kernel", object() if jupyter else None, raising=False)
        valid = data.draw(SUBCOMMAND_WORDS[command], label="words")
        extra = data.draw(noise(), label="noise")
        mix = data.draw(st.integers(0, 2), label="mix") if extra else 0
        line = line_for(argv_for(command, valid, extra, mix), data.draw(st.integers(0, 3), label="quoting"))
        seen[fuzz_magic(shell, capsys, line)] += 1

    lines()
    report(f"%hw {command}", seen, least_ok=5, least_usage=20, examples=examples)


def test_bare_hw_with_any_words_is_the_panel_or_a_one_line_usage_error(
    shell: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: Counter[str] = Counter()
    every = [*QUOTES, *commands.MAGIC_COMMANDS, "plan", "-h", "--help"]

    @SETTINGS
    @seed(1)
    @given(
        argv=st.lists(st.one_of(RANDOM_WORDS, UNKNOWN_OPTIONS, st.sampled_from(every)), max_size=3),
        quoting=st.integers(0, 1),
        jupyter=st.booleans(),
    )
    def lines(argv: list[str], quoting: int, jupyter: bool) -> None:
        monkeypatch.setattr(shell, "kernel", object() if jupyter else None, raising=False)
        seen[fuzz_magic(shell, capsys, line_for(argv, quoting))] += 1

    lines()
    report("%hw (bare)", seen, least_ok=3, least_usage=50)


# One value at a time on an otherwise valid line, so that each value reaches the code that reads it.
ONE_VALUE: dict[str, tuple[str, st.SearchStrategy[str]]] = {
    "memory --interval": ("memory --stop --interval {}", either(NUMBERS, r"[-+]?[0-9_.]{0,6}(e[-+]?[0-9]{1,3})?")),
    "memory --window": ("memory --stop --window {}", either(NUMBERS, r"[-+]?[0-9_.]{0,9}(e[-+]?[0-9]{1,3})?")),
    "attention MODEL": ("attention {} --offline", models()),
    "attention --device": ("attention --device {}", either(BAD_DEVICES + GOOD_DEVICES, DEVICE_LIKE)),
    "attention --dtype": ("attention --dtype {}", st.one_of(st.sampled_from(DTYPES), RANDOM_WORDS)),
    "attention --kernel": ("attention --kernel {}", either(KERNELS, r"[A-Za-z0-9_./:@ -]{0,24}")),
    "load MODEL": ("load {} --emit", models()),
    "load --device-map": ("load TINY --emit --device-map {}", st.one_of(either(DEVICE_MAPS, DEVICE_LIKE), literals())),
    "load --dtype": ("load TINY --emit --dtype {}", st.one_of(st.sampled_from(DTYPES), RANDOM_WORDS)),
    "load --attn": ("load TINY --emit --attn {}", either(ATTNS, r"(paged\|)?[a-z_/:@-]{0,20}")),
    "load --quantize": ("load TINY --emit --quantize {}", st.one_of(st.sampled_from(["4bit", "8bit"]), RANDOM_WORDS)),
    "load --padding": ("load TINY --emit --batch 2 --padding {}", either(["left", "none", "right", ""], "[a-z]{0,5}")),
    "attention --target": ("attention --target {}", either(TARGETS, TARGET_LIKE)),
    "quantization --target": ("quantization --target {}", either(TARGETS, TARGET_LIKE)),
    "load --target": ("load TINY --emit --target {}", either(TARGETS, TARGET_LIKE)),
    "load --max-memory": (
        "load TINY --emit --max-memory {}",
        st.tuples(either(["0", "1", "cpu", "disk", "mps", "-1", ""], DEVICE_LIKE), SIZES).map("=".join),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("what", list(ONE_VALUE))
def test_each_value_on_a_valid_line_is_valid_or_a_one_line_usage_error(
    shell: Any, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    template, values = ONE_VALUE[what]
    seen: Counter[str] = Counter()

    @settings(SETTINGS, max_examples=100)
    @seed(zlib.crc32(what.encode()))
    @given(value=values)
    def lines(value: str) -> None:
        value = tiny() if value == "TINY" else value
        line = template.replace("TINY", shlex.quote(tiny())).format(shlex.quote(value))
        seen[fuzz_magic(shell, capsys, line)] += 1

    lines()
    print(f"\n%hw {what}: {sum(seen.values())} values, {seen['ok']} valid, {seen['usage']} usage errors")
    assert sum(seen.values()) >= 90 and seen["usage"] >= 10, seen


# Lines that once broke nbhw (found by the tests above): each stays a one-line UsageError.
SHARP_EDGES = [
    ('load --device-map \'{"": ' + "-" * 5000 + "1}' --emit", "is not a dict literal"),  # RecursionError
    ("load --device-map '{" + "[" * 300 + "'", "is not a dict literal"),
    ("load --device-map '{[1]: 2}'", "is not a dict literal"),  # TypeError: unhashable key
    ("load --device-map '{{}: \"cpu\"}' --emit", "is not a dict literal"),
    ("memory --interval 3600 --window 1e300", "2.78e+296 samples; at most 20000"),  # a 297-digit number before
]


@pytest.mark.parametrize(("line", "says"), SHARP_EDGES, ids=[f"edge{i}" for i in range(len(SHARP_EDGES))])
def test_lines_that_once_broke_nbhw_are_one_line_usage_errors(
    shell: Any, capsys: pytest.CaptureFixture[str], line: str, says: str
) -> None:
    assert run_line(shell, line, capsys) == "usage"
    with pytest.raises(UsageError, match=re.escape(says)):
        shell.run_line_magic("hw", line)


@pytest.mark.slow
def test_free_deletes_exactly_the_named_variables_and_a_mistake_deletes_nothing(
    shell: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: Counter[str] = Counter()
    setup = "import torch\nkeep = torch.zeros(10)\nalso = torch.zeros(20)\nsame = keep\nn = 5"
    held = {"keep", "also", "same"}

    @settings(SETTINGS, max_examples=60)  # each line is a gc.collect() and a count of every tensor
    @seed(21)
    @given(
        names=st.lists(
            st.one_of(st.sampled_from([*sorted(held), "n"]), either(FREE_NAMES, r"[a-z_]{0,6}")), max_size=3
        ),
        switches=st.lists(FREE_SWITCHES, max_size=2).map(lambda groups: [w for g in groups for w in g]),
    )
    def lines(names: list[str], switches: list[str]) -> None:
        shell.run_cell(setup, store_history=True)
        before = {k: v for k, v in shell.user_ns.items() if k in held | {"n"}}
        outcome = run_line(shell, shlex.join(["free", *names, *switches]), capsys)
        after = {k: v for k, v in shell.user_ns.items() if k in held | {"n"}}
        if outcome == "usage":
            assert after.keys() == before.keys() and all(after[k] is before[k] for k in after), names
        else:
            assert after.keys() == before.keys() - set(names), (names, sorted(after))
            assert all(after[k] is before[k] for k in after), names  # what stays is the very same object
        seen[outcome] += 1

    lines()
    print(f"\n%hw free NAME: {sum(seen.values())} lines, {seen['ok']} valid, {seen['usage']} usage errors")
    assert seen["ok"] >= 5 and seen["usage"] >= 20, seen


# ---------------------------------------------------------------- the command line


def cli_outcome(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    code = main(argv)
    out = capsys.readouterr()
    assert nbhw_threads() == [], argv
    if code == 2:
        if not argv:  # bare `nbhw`: its usage, exit 2
            assert "usage:" in out.out
            return "usage"
        lines = out.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, out.err)
        assert "Traceback" not in out.err and out.out == "", (argv, out)
        return "usage"
    assert code in (0, 1), (argv, code)
    assert code == 0 or argv[0] in {"plan", "doctor"}, (argv, code, "only plan and doctor exit 1 (problems found)")
    assert out.out, argv
    return "ok"


@pytest.mark.slow
@pytest.mark.parametrize("command", list(CLI_WORDS))
def test_every_cli_line_is_valid_or_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tiny()
    seen: Counter[str] = Counter()

    @SETTINGS
    @seed(zlib.crc32(command.encode()))
    @given(data=st.data())
    def lines(data: st.DataObject) -> None:
        valid = data.draw(CLI_WORDS[command], label="words")
        extra = data.draw(noise(), label="noise")
        mix = data.draw(st.integers(0, 2), label="mix") if extra else 0
        seen[cli_outcome(argv_for(command, valid, extra, mix), capsys)] += 1

    lines()
    report(f"nbhw {command}", seen, least_ok=5, least_usage=20)


def test_bare_cli_with_any_words_is_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    seen: Counter[str] = Counter()
    every = [*QUOTES, *commands.CLI_COMMANDS, "load", "memory"]

    @SETTINGS
    @seed(2)
    @given(argv=st.lists(st.one_of(RANDOM_WORDS, UNKNOWN_OPTIONS, st.sampled_from(every)), max_size=3))
    def lines(argv: list[str]) -> None:
        if argv and argv[0] in commands.CLI_COMMANDS:
            argv = ["--bogus", *argv]  # the subcommands' valid lines are the tests above
        if any(a in {"-h", "--help"} or (a.startswith("--h") and "--help".startswith(a)) for a in argv):
            argv = [a for a in argv if not a.startswith("-h") and not a.startswith("--h")]
        seen[cli_outcome(argv, capsys)] += 1

    lines()
    report("nbhw (bare)", seen, least_ok=0, least_usage=100)


SUBPROCESS_LINES = [
    ["plan", "./nope"],
    ["plan", "--max-memory", "0=80GB!"],
    ["plan", "--device-map", "gpu"],
    ["plan", "--dtype", "int8"],
    ["attention", "--device", "cuda:x"],
    ["attention", "--attn", "sdpa"],
    ["attention", 'org/na"me\n'],
    ["devices", "--jsn"],
    ["report", "'unbalanced"],
    ["memory", "--stop"],  # %hw memory --stop: a terminal process has no sampler to stop
]


# Each of these real processes pays the interpreter's start and nbhw's import (a second, torch's too on some lines):
# two lines run alone, as `python -m nbhw ...`; every line runs through the process entry, in one more process.
ALONE = [["devices", "--jsn"], ["attention", 'org/na"me\n']]
BATCH = Path(__file__).resolve().parents[1] / "support" / "cli_batch.py"


def _one_error_line(argv: list[str], code: object, out: str, err: str) -> None:
    assert code == 2, (argv, code, err)
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("error: "), (argv, out, err)


@pytest.mark.slow
def test_mistakes_in_a_real_process_exit_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "env": env, "cwd": tmp_path}
    batch = subprocess.Popen([sys.executable, str(BATCH), json.dumps(SUBPROCESS_LINES)], **pipes)  # type: ignore[call-overload]
    alone = [subprocess.Popen([sys.executable, "-m", "nbhw", *argv], **pipes) for argv in ALONE]  # type: ignore[call-overload]
    for argv, proc in zip(ALONE, alone, strict=True):
        out, err = proc.communicate(timeout=180)
        _one_error_line(argv, proc.returncode, out, err)
    out, err = batch.communicate(timeout=300)
    assert batch.returncode == 0 and err == "", (batch.returncode, err)  # nothing reached the stderr of the process
    results = json.loads(out)
    assert [r["argv"] for r in results] == SUBPROCESS_LINES
    for r in results:
        _one_error_line(r["argv"], r["code"], r["out"], r["err"])
        assert r["threads"] == [], r
