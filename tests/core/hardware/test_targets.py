"""The accelerator catalog and target= words: package data, consistent with nbhw's backends and torch's dtype rules;
loose names and counts; one-line errors that name the valid forms."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from importlib import resources
from typing import Any

import pytest
from IPython.core.error import UsageError

import nbhw
from nbhw.core.hardware import backends
from nbhw.core.hardware import targets as T

ASKED = [  # issue 17's list, by the names a person would type
    "T4", "V100 16GB", "A10G", "L4", "L40S", "A100 40GB", "A100 80GB", "H100 PCIe", "H100 SXM", "H200", "B200",
    "RTX 3090", "RTX 4090", "RTX 5090", "MI210", "MI250X", "MI300X", "MI325X", "Radeon RX 7900 XTX", "Gaudi 2",
    "Gaudi 3", "Data Center GPU Max 1550", "Arc A770", "M3 Max 128GB", "M4 Max", "TPU v5e", "TPU v5p", "TPU v6e",
    "Trainium", "Trainium2", "Inferentia2", "Ascend 910B",
]  # fmt: skip


# ---------------------------------------------------------------- the catalog


def test_the_catalog_ships_as_json_inside_the_package() -> None:
    path = resources.files("nbhw.core.hardware").joinpath("catalog.json")
    assert path.is_file()
    assert json.loads(path.read_text(encoding="utf-8"))["schema"] == 1


def test_the_shipped_catalog_has_no_problems_and_over_30_entries_across_vendors() -> None:
    assert T.catalog_problems() == []
    entries = T.catalog()
    assert len(entries) >= 30
    assert {a.vendor for a in entries} == {"NVIDIA", "AMD", "Intel", "Apple", "Google", "AWS", "Huawei"}


@pytest.mark.parametrize("name", ASKED)
def test_every_name_the_issue_asks_for_resolves_to_one_entry(name: str) -> None:
    assert T.lookup(name) in T.catalog()


def test_every_entry_names_an_nbhw_backend_and_its_device_string() -> None:
    rows = {b.key: b.device for b in backends.BUILTIN}
    for a in T.catalog():
        assert rows[a.backend] == a.device, a.key


def test_nvidia_dtypes_follow_compute_capability() -> None:
    for a in T.catalog():
        if a.backend == "cuda":
            cc = a.capability
            assert cc is not None
            assert a.dtypes["bf16"] == a.dtypes["tf32"] == (cc >= (8, 0)), a.key
            assert a.dtypes["fp8"] == (cc >= (8, 9)), a.key
            assert a.dtypes["fp4"] == (cc[0] >= 10), a.key


def test_amd_entries_carry_the_gfx_arch_torch_reports() -> None:
    mi300x = T.lookup("MI300X")
    assert (mi300x.arch, mi300x.capability, mi300x.device_type) == ("gfx942", (9, 4), "rocm")
    assert T.lookup("MI210").capability == (9, 0)  # gfx90a: HIP reports 9.0
    assert T.lookup("MI250X").devices_per_card == 2


def test_apple_entries_plan_against_metals_working_set_not_all_of_ram() -> None:
    m3 = T.lookup("M3 Max 128GB")
    assert m3.unified_memory and m3.usable_memory_gib == 96.0 and m3.memory_bytes == 96 * 1024**3
    assert (m3.usable_from, m3.ecc, m3.box) == ("working-set rule", "none", "128 GiB unified")
    assert T.lookup("M3 Pro 36GB").usable_memory_gib == 24.0


def test_every_entry_plans_its_usable_memory_beside_the_box_with_its_source() -> None:
    for a in T.catalog():
        assert 0 < a.usable_memory_gib <= a.memory_gib and a.memory_bytes == int(a.usable_memory_gib * 1024**3), a.key
        assert a.usable_source.startswith("https://") and a.usable_basis and a.usable_from in T.USABLE_FROM, a.key
        # no figure found: the entry says so and plans the box's number, never an invented one
        assert (a.usable_from == "vendor") == (a.usable_basis.startswith("the vendor's number; no measured")), a.key
        if a.usable_from == "vendor":
            assert a.usable_memory_gib == a.memory_gib, a.key
    measured = {a.key: a.usable_memory_gib for a in T.catalog() if a.usable_from == "measured"}
    assert measured["t4"] == 14.75 and measured["h200"] == 139.81 and measured["l4"] == 21.95


def test_every_entry_has_an_https_source_and_names_which_figures_were_confirmed_where() -> None:
    fields = set(T.REQUIRED) | set(T.OPTIONAL) | {f"dtypes.{d}" for d in T.DTYPES}
    for a in T.catalog():
        assert a.source.startswith("https://")
        assert set(a.confirmed) <= fields and set(a.unconfirmed) <= fields, a.key
        assert all(url.startswith("https://") for url in a.confirmed.values()), a.key


def _broken(mutate: str) -> list[str]:
    data = copy.deepcopy(T._raw())
    t4 = next(e for e in data["accelerators"] if e["key"] == "t4")
    if mutate == "bf16":
        t4["dtypes"]["bf16"] = True
    elif mutate == "backend":
        t4["backend"] = "gpu"
    elif mutate == "device":
        t4["device"] = "xpu"
    elif mutate == "alias":
        t4["aliases"].append("H100")
    elif mutate == "field":
        del t4["source"]
    elif mutate == "over the box":
        t4["usable_memory_gib"] = 16.5
    elif mutate == "no source":
        t4["usable_source"] = "a forum post"
    elif mutate == "ecc carve-out":
        t4["usable_memory_gib"] = 15.5  # ECC on keeps 1/16: at most 15 of 16 GiB
    elif mutate == "vendor":
        t4["usable_from"] = "vendor"
    elif mutate == "ecc word":
        t4["ecc"] = "yes"
    return T.catalog_problems(data)


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        ("bf16", "bf16 is True but compute capability 7.5"),
        ("backend", "not an nbhw backend key"),
        ("device", "device string"),
        ("alias", "belongs to both"),
        ("field", "missing ['source']"),
        ("over the box", "usable_memory_gib 16.5 must be above 0 and at most memory_gib 16"),
        ("no source", "usable memory needs an https usable_source"),
        ("ecc carve-out", "ecc 'on' keeps 1/16 for ECC bits: usable_memory_gib 15.5 is above 15"),
        ("vendor", "usable_from 'vendor' is the box number: usable_memory_gib 14.75 must be 16"),
        ("ecc word", "ecc one of ('on', 'off', 'none', 'sideband')"),
    ],
)
def test_the_check_catches_an_inconsistent_entry(mutate: str, words: str) -> None:
    assert any(words in p for p in _broken(mutate))


# ---------------------------------------------------------------- target= words


@pytest.mark.parametrize("text", ["RTX 4090", "rtx-4090", "RTX4090", "NVIDIA GeForce RTX 4090", "4090"])
def test_names_match_loosely(text: str) -> None:
    assert T.parse_target(text).accelerator.key == "rtx-4090"


@pytest.mark.parametrize("text", ["2x H100-80GB", "2 x H100", "2×H100", "2*H100", "2X h100", "2 H100"])
def test_counts_in_every_spelling(text: str) -> None:
    t = T.parse_target(text)
    assert (t.accelerator.key, t.cards, t.count, t.text) == ("h100-sxm", 2, 2, "2x H100 SXM")
    assert T.parse_target(t.text) == t  # the canonical words read back as the same target


def test_a_name_with_digits_is_not_read_as_a_count() -> None:
    assert T.parse_target("7900 XTX").cards == 1
    assert T.parse_target("2x 7900 XTX").cards == 2


def test_a_memory_suffix_picks_the_variant() -> None:
    assert T.parse_target("4 x A100-80G").accelerator.key == "a100-80gb"
    assert T.parse_target("A100 40GB").accelerator.key == "a100-40gb"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("A100", "matches several: A100 40GB, A100 80GB; name one"),
        ("M3 Max", "matches several"),
        ("H1000", "unknown target 'H1000'; close matches: H100"),
        ("0x H100", "the count must be a whole number from 1 to 64; valid forms: 'NAME', '2x NAME'"),
        ("3.5x A100", "the count must be a whole number from 1 to 64; valid forms: 'NAME', '2x NAME'"),
        ("65x H100", "the count must be a whole number from 1 to 64; valid forms: 'NAME', '2x NAME'"),
        ("-1x T4", "the count must be a whole number from 1 to 64"),
        ("2x M3 Max 128GB", "a Mac has one mps device"),
        ("", "empty target"),
    ],
)
def test_bad_targets_are_one_line_errors(text: str, words: str) -> None:
    with pytest.raises(nbhw.UserError) as err:
        T.parse_target(text)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_target_gives_the_rows_detection_would_give_on_it() -> None:
    rows = T.parse_target("1x MI250X").devices()
    assert [r.device for r in rows] == ["cuda:0", "cuda:1"]  # one module, two GCDs
    assert rows[0].compute_capability == "gfx90a" and rows[0].bf16 is True
    t4 = T.parse_target("T4").devices()[0]
    assert (t4.compute_capability, t4.bf16, t4.tf32, t4.total_memory) == ("7.5", False, False, int(14.75 * 1024**3))
    backend = T.parse_target("2x H100").rows()[1]
    usable = int(79.2 * 1024**3)  # torch's total on an H100 80GB HBM3, not the box's 80 GiB
    assert backend.key == "cuda" and backend.usable and [d.free_memory for d in backend.devices] == [usable] * 2


@pytest.mark.parametrize("text", ["T4 ECC off", "t4 ecc off", "T4 (ECC off)", "Tesla T4, ECC-off", "1x T4 ecc_off"])
def test_ecc_off_gives_a_gddr_card_its_sixteenth_back(text: str) -> None:
    t = T.parse_target(text)
    a = t.accelerator
    assert (t.text, t.label, a.ecc_off, a.usable_gib) == ("T4 ECC off", "1x T4 (ECC off)", True, 15.75)
    assert a.memory_bytes == int(15.75 * 1024**3) and t.devices()[0].total_memory == a.memory_bytes
    assert T.parse_target(t.text) == t == T.check_target(text) and T.target_word(T.check_target(text)) == "T4 ECC off"


def test_ecc_off_counts_and_reads_back_as_the_same_target() -> None:
    t = T.parse_target("2x L4 ECC off")
    assert (t.text, t.cards, t.accelerator.usable_gib) == ("2x L4 ECC off", 2, 23.45)  # 21.95 + 24 / 16
    assert T.parse_target(t.text) == t and T.Target(t.accelerator, 4).text == "4x L4 ECC off"
    assert T.parse_target("L4").accelerator.usable_gib == 21.95


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("H100 ECC off", "'H100 SXM ECC off': its HBM keeps ECC bits outside the memory, so ECC off frees nothing"),
        ("2x MI300X ECC off", "its HBM keeps ECC bits outside the memory"),
        ("RTX 4090 ECC off", "its memory has no ECC to turn off"),
        ("RTX 6000 Ada ECC off", "its ECC is already off as it ships"),
        ("ECC off", "target 'ECC off' names no card; valid forms: 'NAME', '2x NAME'"),
    ],
)
def test_ecc_off_where_it_frees_nothing_is_a_one_line_error_naming_where_it_applies(text: str, words: str) -> None:
    with pytest.raises(nbhw.UserError) as err:
        T.parse_target(text)
    message = str(err.value)
    assert words in message and "\n" not in message
    assert message.endswith("ECC off applies to T4, A10G, A10, L4, L40S") or "valid forms" in message


def test_targets_lists_the_catalog_in_text_html_and_json() -> None:
    listing = nbhw.targets()
    assert len(listing.rows) == len(T.catalog())
    assert "H100 SXM" in listing.text() and "<table" in listing.html()
    t4 = next(line for line in listing.text().splitlines() if line.startswith("T4 "))
    assert "14.75 GiB" in t4 and "16 GiB" in t4 and "on (1/16)" in t4
    assert "usable memory" in listing.text() and "box" in listing.html()
    assert {"usable_memory_gib", "usable_source", "ecc"} <= set(listing.to_dict()["accelerators"][0])
    assert json.dumps(listing.to_dict())
    assert {a.vendor for a in nbhw.targets("amd").rows} == {"AMD"}
    with pytest.raises(nbhw.UserError, match="valid: AMD, AWS, Apple"):
        nbhw.targets("acme")


# ---------------------------------------------------------------- every surface takes the words


def test_the_magic_takes_target_everywhere_and_refuses_it_with_max_memory(ip: Any, capsys: Any) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("hw", "targets --vendor Google --json")
    assert {a["name"] for a in json.loads(capsys.readouterr().out)["accelerators"]} >= {"TPU v5e", "TPU v6e"}
    ip.run_line_magic("hw", 'load --target "2 x T4" --dtype float16 --json')
    data = json.loads(capsys.readouterr().out)
    assert data["arguments"]["target"] == "2x T4" and data["target"] == "2x T4"
    with pytest.raises(UsageError, match="--target and --max-memory both set the memory to plan for; give one"):
        ip.run_line_magic("hw", "load --target T4 --max-memory 0=10GiB")
    for line in ('attention --target "0x H100"', 'load --target "3.5x A100"', "quantization --target H1000"):
        with pytest.raises(UsageError) as err:
            ip.run_line_magic("hw", line)
        assert "\n" not in str(err.value) and ("valid forms" in str(err.value) or "close matches" in str(err.value))


@pytest.mark.slow
def test_the_cli_refuses_bad_targets_with_exit_2_and_one_line() -> None:
    for argv in (["load", "--target", "65x H100"], ["load", "--target", "T4", "--max-memory", "0=1GiB"]):
        proc = subprocess.run(
            [sys.executable, "-m", "nbhw", *argv], capture_output=True, text=True, timeout=180, check=False
        )
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: "), proc.stderr


def test_a_target_reads_back_as_its_words_and_they_name_it_exactly() -> None:
    # A plan's arguments show target=Target('T4'), and the solver's caches key plans by that repr: it must be unique.
    made = [T.Target(a, cards) for a in T.catalog() for cards in ((1,) if a.unified_memory else (1, 2))]
    for t in made:  # a Mac has one device: one card
        assert repr(t) == f"Target({t.text!r})" and T.parse_target(t.text) == t == T.check_target(t.text)
    assert len({repr(t) for t in made}) == len(set(made)) == len(made)  # hashable: cache keys hold targets
