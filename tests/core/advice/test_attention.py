"""The attention / kernel / dtype advisor agrees with what transformers itself does; faked GPUs give the right rows."""

from __future__ import annotations

import ast
import copy
import enum
import importlib.machinery
import importlib.util
import json
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError

from nbhw.__main__ import main
from nbhw.core.advice import attention_rules
from nbhw.core.advice.attention import advise
from nbhw.core.advice.status import STATUSES, Status
from nbhw.core.errors import UserError
from nbhw.core.hf import kernel_tables, meta_build
from nbhw.core.hf.library_source import library_file
from tests.support.fakes import FakeGpu, FakeHardware

# ---------------------------------------------------------------- tiny local models


def _configs() -> dict[str, Any]:
    from transformers import BloomConfig, GPT2Config, GPTNeoConfig, LlamaConfig, Qwen3Config

    small = {"vocab_size": 300, "bos_token_id": 1, "eos_token_id": 1, "pad_token_id": 1}
    return {
        "qwen3": Qwen3Config(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, architectures=["Qwen3ForCausalLM"], **small,
        ),
        "llama": LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, architectures=["LlamaForCausalLM"], **small,
        ),
        # A class without sdpa, flash or flex attention.
        "bloom": BloomConfig(hidden_size=64, n_layer=2, n_head=4, architectures=["BloomForCausalLM"], **small),
        # sdpa and flash attention, but no flex_attention.
        "gpt2": GPT2Config(n_embd=64, n_layer=2, n_head=4, architectures=["GPT2LMHeadModel"], **small),
        # flash attention but no sdpa, and its own attention table (not transformers' AttentionInterface).
        "gptneo": GPTNeoConfig(
            hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
            architectures=["GPTNeoForCausalLM"], **small,
        ),
    }  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each tiny config saved as a local model folder (config.json only: advice never needs weights)."""
    root = tmp_path_factory.mktemp("models")
    found = {}
    for name, config in _configs().items():
        config.save_pretrained(root / name)
        found[name] = root / name
    return found


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here may reach the Hub."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def transformers_builds(config: Any, auto_class: str, key: str, dtype: str) -> tuple[bool, str | None]:
    """Independently of nbhw: does transformers build this config on the meta device with this attn_implementation?"""
    import torch
    import transformers

    auto = getattr(transformers, auto_class)
    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            model = auto.from_config(copy.deepcopy(config), dtype=getattr(torch, dtype), attn_implementation=key)
    except Exception:
        return False, None
    return True, str(model.config._attn_implementation)


def fake_flash_packages(monkeypatch: pytest.MonkeyPatch, *dists: str) -> None:
    """flash-attn distributions 'installed', at the boundary transformers checks: find_spec + packages_distributions."""
    import transformers.modeling_flash_attention_utils as flash_utils
    from transformers.utils import import_utils

    imports = {"flash-attn": "flash_attn", "flash-attn-3": "flash_attn_interface", "flash-attn-4": "flash_attn"}
    fake: dict[str, list[str]] = {}
    for dist in dists:
        fake.setdefault(imports[dist], []).append(dist.replace("-", "_"))
    real_find_spec = importlib.util.find_spec
    real_mapping = import_utils._package_distribution_mapping()

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return importlib.machinery.ModuleSpec(name, None) if name in fake else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(flash_utils, "_package_distribution_mapping", lambda: {**real_mapping, **fake})


def fake_kernels_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernels version within transformers' range, at the boundary nbhw and transformers ask."""
    from transformers.utils import import_utils

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(import_utils, "is_kernels_available", lambda *a, **k: True)
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a, **k: importlib.machinery.ModuleSpec(name, None) if name == "kernels" else real_find_spec(name),
    )


def no_kernels_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """No usable kernels (transformers < 5.25 without it), at every boundary nbhw and transformers ask."""
    import transformers.modeling_flash_attention_utils as flash_utils
    from transformers import modeling_utils
    from transformers.integrations import hub_kernels
    from transformers.utils import import_utils

    for module in (import_utils, modeling_utils, flash_utils, hub_kernels):
        if hasattr(module, "is_kernels_available"):
            monkeypatch.setattr(module, "is_kernels_available", lambda *a, **k: False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a, **k: None if name == "kernels" else real_find_spec(name, *a, **k)
    )


def record_builds(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every attn_implementation nbhw builds with."""
    built: list[Any] = []
    real = meta_build.build

    def build(config: Any, **kwargs: Any) -> meta_build.MetaBuild:
        built.append(kwargs.get("attn_implementation"))
        return real(config, **kwargs)

    monkeypatch.setattr(meta_build, "build", build)
    return built


# ---------------------------------------------------------------- agreement with transformers on this CPU machine


@pytest.mark.parametrize("name", ["qwen3", "llama", "bloom", "gpt2", "gptneo"])
def test_every_row_agrees_with_a_meta_build_by_transformers(models: dict[str, Path], name: str) -> None:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    adv = advise(str(models[name]), device="cpu", dtype="bfloat16")
    keys = [r.key for r in adv.rows]
    for key in ["eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()]:
        assert key in keys, f"{key} listed by transformers but not advised"
    config = _configs()[name]
    for row in adv.rows:
        assert row.status in {Status.WORKS, Status.WONT}, (row.key, row.status)  # nothing downloads on this machine
        # With kernels installed (transformers >= 5.25 requires it) a flash row without its package would fetch a
        # Hub kernel: nbhw doesn't build it, and transformers' own build (offline: no download here) fails too.
        downloads = (row.check or "").startswith("not checked: a build would download")
        assert row.checked or (downloads and row.status is Status.WONT), (row.key, row.check)
        with meta_build.forced_offline():
            ok, resolved = transformers_builds(config, adv.auto_class, row.key, "bfloat16")
        assert ok == (row.status == Status.WORKS), (row.key, row.status, row.reason)
        if ok and resolved != row.key:
            assert row.resolves_to == resolved, row.key


@pytest.mark.parametrize("name", ["qwen3", "llama", "bloom", "gpt2"])
def test_the_rules_nbhw_reads_agree_with_the_build_without_correction(models: dict[str, Path], name: str) -> None:
    adv = advise(str(models[name]), device="cpu")
    for row in adv.rows:
        # A row that would fetch a Hub kernel (flash_attention_N without its package, kernels installed) is not built.
        skipped = row.status is Status.WONT and (row.check or "").startswith("not checked: a build would download")
        assert row.check == "meta build agrees" or skipped, (row.key, row.check, row.notes)


def test_a_model_with_its_own_attention_table_is_corrected_by_the_build(models: dict[str, Path]) -> None:
    adv = advise(str(models["gptneo"]), device="cpu")
    paged = adv.row("paged|eager")
    assert paged.status == Status.WONT and paged.checked and paged.error
    assert any("nbhw's reading" in n for n in paged.notes)


def test_model_flags_drive_the_rows(models: dict[str, Path]) -> None:
    import transformers

    bloom = advise(str(models["bloom"]), device="cpu")
    cls = transformers.BloomForCausalLM
    assert not (cls._supports_sdpa or cls._supports_flash_attn or cls._supports_flex_attn)
    for key in ("sdpa", "flex_attention", "flash_attention_2", "kernels-community/flash-attn2"):
        assert bloom.row(key).status == Status.WONT
        assert attention_rules.NO_SUPPORT in (bloom.row(key).fix or ""), key
    gpt2 = advise(str(models["gpt2"]), device="cpu")
    assert gpt2.row("flex_attention").status == Status.WONT and gpt2.row("sdpa").status == Status.WORKS


@pytest.mark.parametrize(("name", "default"), [("qwen3", "sdpa"), ("bloom", "eager"), ("gptneo", "eager")])
def test_none_means_sdpa_and_silently_eager_without_it(models: dict[str, Path], name: str, default: str) -> None:
    adv = advise(str(models[name]), device="cpu")
    _, resolved = transformers_builds(_configs()[name], adv.auto_class, None, "bfloat16")  # type: ignore[arg-type]
    assert adv.default.resolves_to == resolved == default and adv.default.checked
    if default == "eager":
        assert "falls back to eager silently" in adv.default.reason
    assert any(n.startswith("attn_implementation=None") for n in adv.silent)


def test_without_a_model_the_hardware_alone_is_checked_with_the_reference_class() -> None:
    adv = advise(device="cpu")
    assert adv.model is None and adv.model_class == "Qwen3ForCausalLM"
    assert adv.row("sdpa").status == Status.WORKS and adv.row("sdpa").checked
    assert "No model given" in adv.text()


def test_kernels_out_of_range_turns_every_hub_feature_off_and_says_the_range(fake_hw: FakeHardware) -> None:
    from transformers.utils import import_utils

    fake_hw.linux_cpu_machine()
    ok, _ = meta_build.kernels_status()
    assert not ok  # kernels missing (faked): transformers treats it as out of its range too
    adv = advise(device="cpu")
    rng = f"kernels>={import_utils.KERNELS_MIN_VERSION},<{import_utils.KERNELS_MAX_VERSION}"
    for key in metabuild_fallbacks():
        assert adv.row(key).status == Status.WONT and rng in (adv.row(key).fix or "")
    assert not adv.kernels.use_kernels and rng in (adv.kernels.fix or "")


def metabuild_fallbacks() -> list[str]:
    from transformers.modeling_flash_attention_utils import FLASH_ATTN_KERNEL_FALLBACK

    return list(dict.fromkeys(FLASH_ATTN_KERNEL_FALLBACK.values()))


# ---------------------------------------------------------------- faked GPUs


def _need(version: int) -> int:
    from transformers.modeling_flash_attention_utils import FLASH_ATTENTION_COMPATIBILITY_MATRIX

    # FA3/FA4 from transformers' matrix; FA2's Ampere floor is flash-attn's own (the matrix doesn't hold it).
    return FLASH_ATTENTION_COMPATIBILITY_MATRIX[version].get("cuda_min_major_version") or attention_rules.FA2_MIN_MAJOR


@pytest.mark.parametrize("cc", [(7, 5), (8, 0), (9, 0)])
@pytest.mark.parametrize("installed", [True, False])
def test_fake_nvidia_gpu_gives_the_flash_rows_of_its_generation(
    fake_hw: Any, monkeypatch: pytest.MonkeyPatch, models: dict[str, Path], cc: tuple[int, int], installed: bool
) -> None:
    fake_hw.nvidia(FakeGpu(cc=cc))
    if installed:
        fake_flash_packages(monkeypatch, "flash-attn", "flash-attn-3", "flash-attn-4")
    adv = advise(str(models["qwen3"]))
    assert adv.device == "cuda:0" and adv.present and not adv.live
    for version in (2, 3, 4):
        row = adv.row(f"flash_attention_{version}")
        if not installed and meta_build.kernels_status()[0]:
            # With kernels usable (transformers >= 5.25 requires it) the missing package sends transformers to the
            # Hub kernel: a download at load, so not built here, and named.
            fallback = kernel_tables.flash_kernel_fallback(rocm=False)[f"flash_attention_{version}"]
            assert row.status == Status.DOWNLOAD and not row.checked and row.resolves_to == fallback, (version, row)
            assert attention_rules.flash_package(version) in row.reason and fallback in row.check
        elif not installed:
            # transformers checks the package before the device: a build here says the same, so it is checked.
            assert row.status == Status.WONT and row.checked and attention_rules.flash_package(version) in row.reason
        elif cc[0] >= _need(version):
            assert row.status == Status.WORKS and not row.checked, (version, row)
            assert "read from transformers' rules" in row.check
        else:
            assert row.status == Status.WONT and f"compute capability {_need(version)}.0" in row.reason, (version, row)
    assert adv.row("sdpa").checked and adv.row("sdpa").status == Status.WORKS


@pytest.mark.parametrize(("cc", "dtype", "flag"), [((7, 5), "float16", "fp16=True"), ((8, 0), "bfloat16", "bf16=True")])
def test_fake_nvidia_dtype_and_training_advice(fake_hw: Any, cc: tuple[int, int], dtype: str, flag: str) -> None:
    fake_hw.nvidia(FakeGpu(cc=cc), FakeGpu(cc=cc), FakeGpu(cc=cc), FakeGpu(cc=cc))
    adv = advise()
    p = adv.precision
    assert p.dtype == dtype == adv.dtype and flag in p.training
    assert (p.tf32 is not None) == (cc[0] >= 8)
    assert "torchrun --nproc_per_node=4 train.py" in p.launch and any("NCCL" in n for n in p.notes)


def test_float32_with_flash_attention_says_to_use_half_precision(
    fake_hw: Any, monkeypatch: pytest.MonkeyPatch, models: dict[str, Path]
) -> None:
    fake_hw.nvidia(FakeGpu(cc=(9, 0)))
    fake_flash_packages(monkeypatch, "flash-attn")
    row = advise(str(models["llama"]), dtype="float32").row("flash_attention_2")
    assert row.status == Status.WORKS and "bfloat16" in (row.fix or "") and any("only warns" in n for n in row.notes)


def test_fake_rocm_gpu_uses_the_rocm_kernel_table(
    fake_hw: Any, monkeypatch: pytest.MonkeyPatch, models: dict[str, Path]
) -> None:
    fake_hw.rocm(FakeGpu(name="AMD Instinct MI300X", arch="gfx942"))
    rocm_fallback = fallback_by_running_the_source(rocm=True)
    with_kernels = advise(str(models["qwen3"])).row("flash_attention_2")
    assert not meta_build.kernels_status()[0] or with_kernels.resolves_to == rocm_fallback["flash_attention_2"]
    no_kernels_package(monkeypatch)
    adv = advise(str(models["qwen3"]))
    assert adv.device == "cuda:0" and adv.device_type == "rocm" and adv.kernels.device_key == "rocm"
    hub_rows = [r.key for r in adv.rows if r.kind == "hub kernel"]
    assert hub_rows == list(dict.fromkeys(rocm_fallback.values()))
    assert rocm_fallback["flash_attention_2"] in (adv.row("flash_attention_2").fix or "")
    assert adv.precision.dtype == "bfloat16"
    fake_flash_packages(monkeypatch, "flash-attn", "flash-attn-3")
    adv = advise(str(models["qwen3"]))
    assert adv.row("flash_attention_2").status == Status.WORKS and adv.row("flash_attention_3").status == Status.WORKS


def test_fake_xpu_npu_and_tpu_follow_transformers_device_rules(
    fake_hw: Any, monkeypatch: pytest.MonkeyPatch, models: dict[str, Path]
) -> None:
    # Import the model code (and torch._dynamo with it) before a fake torch.xpu claims this torch has XPU.
    advise(str(models["qwen3"]), device="cpu")
    fake_hw.xpu(FakeGpu(name="Intel Arc B580"))
    no_kernels_package(monkeypatch)
    xpu = advise(str(models["qwen3"]))
    assert xpu.device == "xpu:0"
    # On XPU transformers takes FlashAttention 2 from a Hub kernel, so without kernels it can't work.
    assert xpu.row("flash_attention_2").status == Status.WONT and "kernels" in xpu.row("flash_attention_2").reason
    fake_kernels_package(monkeypatch)
    assert advise(str(models["qwen3"])).row("flash_attention_2").status == Status.DOWNLOAD
    fake_hw.plugin("npu", "torch_npu", FakeGpu(name="Ascend 910B"))
    npu = advise(str(models["qwen3"]), device="npu:0")
    # transformers runs its own FlashAttention 2 on Ascend (no package, no Hub kernel); FA3 is CUDA-only.
    assert npu.present and npu.row("flash_attention_2").status == Status.WORKS
    assert npu.row("flash_attention_3").status == Status.WONT
    from transformers.utils import import_utils

    fake_hw.tpu()
    # transformers caches its flex check; forget the CPU answer so the build sees the fake TPU too.
    flex_check = import_utils.is_torch_flex_attn_available
    flex_check.cache_clear()
    try:
        tpu = advise(str(models["qwen3"]), device="tpu:0")
    finally:
        flex_check.cache_clear()
    assert tpu.present and tpu.live and tpu.precision.dtype == "bfloat16"
    flex = tpu.row("flex_attention")
    assert flex.status == Status.WONT and flex.checked and flex.check == "meta build agrees"


def test_a_device_that_is_valid_but_absent_is_advised_and_says_so(
    monkeypatch: pytest.MonkeyPatch, models: dict[str, Path]
) -> None:
    adv = advise(str(models["qwen3"]), device="cuda:3")
    assert not adv.present and any("not present here" in n for n in adv.notes)
    assert "not present here" in adv.text()
    fake_flash_packages(monkeypatch, "flash-attn-3")
    row = advise(str(models["qwen3"]), device="cuda").row("flash_attention_3")
    assert row.status == Status.DEPENDS and "not here to check" in row.reason


def test_rows_that_would_download_are_never_built(
    fake_hw: Any, monkeypatch: pytest.MonkeyPatch, models: dict[str, Path]
) -> None:
    fake_hw.nvidia(FakeGpu(cc=(9, 0)))
    fake_kernels_package(monkeypatch)
    built = record_builds(monkeypatch)
    adv = advise(str(models["qwen3"]), kernel="acme/my-attn:attention")
    for key in ("flash_attention_2", "kernels-community/flash-attn2", "acme/my-attn:attention"):
        row = adv.row(key)
        assert row.status == Status.DOWNLOAD and not row.checked and "download" in row.check, key
        assert key not in built
    assert "allow_all_kernels=True" in (adv.row("acme/my-attn:attention").fix or "")
    assert adv.row("flash_attention_2").resolves_to == "kernels-community/flash-attn2"
    # Without a model the rules' answer stands: the Hub kernel is what transformers would use.
    assert advise().row("flash_attention_2").status == Status.HUB


def test_a_user_kernel_without_kernels_is_checked_and_wont_work(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    if meta_build.kernels_status()[0]:  # with kernels (transformers >= 5.25) the kernel is fetched at load: not built
        row = advise(str(models["qwen3"]), device="cpu", kernel="acme/my-attn").row("acme/my-attn")
        assert row.status == Status.DOWNLOAD and not row.checked and "acme/my-attn" in row.check
    no_kernels_package(monkeypatch)
    row = advise(str(models["qwen3"]), device="cpu", kernel="acme/my-attn").row("acme/my-attn")
    assert row.kind == "your kernel" and row.status == Status.WONT and row.checked


# ---------------------------------------------------------------- reading transformers' tables honestly


class _Mode(enum.Flag):
    INFERENCE = enum.auto()
    TRAINING = enum.auto()
    TORCH_COMPILE = enum.auto()


def _function_source(relative: str, name: str) -> str:
    path = library_file("transformers", relative)
    assert path is not None
    text = path.read_text(encoding="utf-8")
    node = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == name)
    return textwrap.dedent(ast.get_source_segment(text, node) or "")


def test_kernel_mapping_read_with_ast_equals_running_transformers_code_with_stand_ins() -> None:
    """Run transformers' own _build_kernel_mapping with recording stand-ins for the kernels package's classes."""
    namespace: dict[str, Any] = {
        "Mode": _Mode,
        "LayerRepository": lambda **kw: f"{kw['repo_id']}:{kw['layer_name']}",
        "Device": lambda type, properties=None: type,
        "CUDAProperties": dict,
        "ROCMProperties": dict,
    }
    exec(_function_source(kernel_tables.HUB_KERNELS_FILE, "_build_kernel_mapping"), namespace)
    ran = namespace["_build_kernel_mapping"]()
    expected = set()
    for layer, devices in ran.items():
        for device, repo in devices.items():
            repos = repo.values() if isinstance(repo, dict) else [repo]
            expected |= {(layer, device, r) for r in repos}
    mapping = kernel_tables.default_mapping()
    assert mapping.problem is None
    read = {(e.layer, e.device, r) for e in mapping.entries for r in e.repos}
    assert read == expected and len(read) > 20


def fallback_by_running_the_source(*, rocm: bool) -> dict[str, str]:
    path = library_file("transformers", kernel_tables.FLASH_UTILS_FILE)
    assert path is not None
    text = path.read_text(encoding="utf-8")
    node = next(
        n
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "FLASH_ATTN_KERNEL_FALLBACK"
    )
    namespace: dict[str, Any] = {"is_rocm_platform": lambda: rocm}
    exec(ast.get_source_segment(text, node) or "", namespace)
    table: dict[str, str] = namespace["FLASH_ATTN_KERNEL_FALLBACK"]
    return table


@pytest.mark.parametrize("rocm", [True, False])
def test_flash_kernel_fallback_for_either_platform(rocm: bool) -> None:
    assert kernel_tables.flash_kernel_fallback(rocm=rocm) == fallback_by_running_the_source(rocm=rocm)


def test_kernels_section_names_the_model_layers_and_a_valid_device_key(fake_hw: Any, models: dict[str, Path]) -> None:
    from transformers.utils.kernel_config import KERNELS_SUPPORTED_DEVICE_TYPES

    fake_hw.nvidia(FakeGpu(cc=(9, 0)))
    adv = advise(str(models["llama"]))
    k = adv.kernels
    assert k.kernel_config_keys == list(KERNELS_SUPPORTED_DEVICE_TYPES) and k.device_key == "cuda"
    assert "RMSNorm" in k.model_layers and "RMSNorm" in {e.layer for e in k.layers}
    assert 'kernel_mapping={"RMSNorm": {"cuda": ' in k.example and "use_kernels=True" in k.example
    compile(k.example, "<example>", "exec")
    cpu = advise(str(models["llama"]), device="cpu").kernels
    assert "cpu is not one of them" in cpu.example
    bloom = advise(str(models["bloom"])).kernels
    assert bloom.model_layers == [] and not bloom.use_kernels and "marks no layer" in bloom.example


# ---------------------------------------------------------------- forms: text, HTML, JSON


def test_text_html_and_json_forms(models: dict[str, Path], fake_hw: FakeHardware) -> None:
    fake_hw.linux_cpu_machine(native_bf16=True)  # the advised dtype below follows the CPU's bf16
    adv = advise(str(models["qwen3"]), device="cpu", dtype="bfloat16")
    text = adv.text()
    for row in adv.rows:
        assert row.key in text
    for part in ("What transformers does without telling you", "Hub kernels", "training: TrainingArguments("):
        assert part in text
    bundle = adv._repr_mimebundle_()
    assert bundle["text/plain"] == text and "<table" in bundle["text/html"] and "&#x27;" in bundle["text/html"]
    data = json.loads(json.dumps(adv.to_dict()))
    assert {r["status"] for r in data["rows"]} <= set(STATUSES)
    assert data["model_class"] == "Qwen3ForCausalLM" and data["precision"]["dtype"] == "bfloat16"
    assert "config" not in json.dumps(data["rows"])


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"device": "gpu"}, "cuda:N"),
        ({"device": "cuda:x"}, "cuda:N"),
        ({"dtype": "fp8"}, "bfloat16"),
        ({"kernel": "not a kernel"}, "ORG/REPO"),
    ],
)
def test_mistakes_are_one_line_user_errors_naming_valid_values(kwargs: dict[str, str], words: str) -> None:
    with pytest.raises(UserError) as err:
        advise(**kwargs)
    assert "\n" not in str(err.value) and "valid" in str(err.value) and words in str(err.value)


# ---------------------------------------------------------------- %hw attention and python -m nbhw attention


def test_hw_attention_magic_text_and_json(ip: Any, models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("hw", f"attention {models['bloom']} --device cpu")
    out = capsys.readouterr().out
    assert "BloomForCausalLM" in out and "falls back to eager silently" in out
    ip.run_line_magic("hw", f"attention {models['bloom']} --json")
    data = json.loads(capsys.readouterr().out)
    assert data["default"]["resolves_to"] == "eager"


@pytest.mark.parametrize("line", ["attention --device gpu", "attention --dtype fp8", "attention --bogus"])
def test_hw_attention_mistakes_are_usage_errors(ip: Any, line: str) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    with pytest.raises(UsageError) as err:
        ip.run_line_magic("hw", line)
    assert "valid" in str(err.value) and "\n" not in str(err.value)


def test_cli_attention(models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attention", str(models["gpt2"]), "--device", "cpu", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {r["key"]: r["status"] for r in data["rows"]}["flex_attention"] == Status.WONT
    assert main(["attention", "--device", "cuda:x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "valid" in err
    assert main(["attention", "nobody/not-cached-anywhere", "--offline"]) == 2
    assert "not available offline" in capsys.readouterr().err


def test_fake_mac_gets_float16_and_the_mps_kernel_key(fake_hw: Any, models: dict[str, Path]) -> None:
    fake_hw.mps()
    adv = advise(str(models["qwen3"]))
    assert adv.device == "mps" and adv.precision.dtype == "float16" and "fp16=True" in adv.precision.training
    assert adv.kernels.device_key == "mps" and "mps" in adv.kernels.kernel_config_keys
    # Whether transformers' mapping has an mps kernel for the model's layers (5.24: mlx-rmsnorm; 5.25: none).
    mps_layers = {e.layer for e in kernel_tables.default_mapping().for_device("mps")}
    usable = meta_build.kernels_status()[0]
    assert adv.kernels.use_kernels == (usable and bool(mps_layers & set(adv.kernels.model_layers)))
    assert adv.row("flash_attention_2").status == Status.WONT


def test_nbhw_attention_is_the_public_entry_point() -> None:
    import nbhw

    assert nbhw.attention is advise and "attention" in dir(nbhw)
    assert isinstance(nbhw.attention(device="cpu"), nbhw.AttentionAdvice)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_kernel_example_is_valid_python_for_a_folder_with_quotes_and_backslashes(
    tmp_path: Path, device: str
) -> None:
    from nbhw.core.hf.tiny_model import tiny_model_path

    folder = tmp_path / "we\"ird \\ name's model"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_model_path() / "config.json").read_text())
    example = advise(str(folder), device=device).kernels.example
    tree = ast.parse(example)  # was: from_pretrained("<path>") with the path's quote ending the string
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "from_pretrained"]
    assert [ast.literal_eval(c.args[0]) for c in calls] == [str(folder)]


# ---------------------------------------------------------------- FlashAttention 4 by GPU, and a GPU nbhw can't see


def install_flash_attn_4(monkeypatch: pytest.MonkeyPatch, root: Path, version: str, majors: list[int]) -> None:
    """An installed flash-attn-4 on sys.path: its dist-info and the assert its forward pass makes, as releases have
    it (4.0.0b4: [9, 10, 11]; 4.0.0b5 on: [8, 9, 10, 11, 12])."""
    import transformers.modeling_flash_attention_utils as flash_utils
    from transformers.utils import import_utils

    cute = root / "flash_attn" / "cute"
    cute.mkdir(parents=True)
    (cute / "interface.py").write_text(
        "def _flash_attn_fwd(q, k, v, _arch=None):\n"
        "    arch = _get_device_arch() if _arch is None else _arch\n"
        f"    assert arch // 10 in {majors}, 'Unsupported compute capability.'\n"
    )
    info = root / f"flash_attn_4-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flash-attn-4\nVersion: {version}\n")
    (info / "top_level.txt").write_text("flash_attn\n")
    monkeypatch.syspath_prepend(str(root))
    real_mapping = import_utils._package_distribution_mapping()
    mapping = {**real_mapping, "flash_attn": ["flash_attn_4"]}
    monkeypatch.setattr(flash_utils, "_package_distribution_mapping", lambda: mapping)


def test_flash_attention_4_on_an_rtx_5090_target_names_the_release_that_runs_there(models: dict[str, Path]) -> None:
    row = advise(str(models["qwen3"]), target="RTX 5090", dtype="bfloat16").row("flash_attention_4")
    # transformers' floor (compute capability 9) lets 12.0 through; flash-attn-4 itself ran on 9.x-11.x only
    # until 4.0.0b5, so the fix names that release, and a note says why.
    assert row.fix == "pip install 'flash-attn-4>=4.0.0b5' on the RTX 5090"
    assert any("12.x from 4.0.0b5" in n and "#2329" in n for n in row.notes)


RELEASES = [  # (flash-attn-4 release, the majors its forward pass asserts, the GPU's capability, the row's status)
    ("4.0.0b4", [9, 10, 11], (12, 0), Status.WONT),
    ("4.0.0b4", [9, 10, 11], (9, 0), Status.WORKS),
    ("4.0.0b36", [8, 9, 10, 11, 12], (12, 0), Status.WORKS),
]


@pytest.mark.parametrize("release", RELEASES)
def test_flash_attention_4_follows_the_gpus_the_installed_release_runs_on(
    fake_hw: FakeHardware, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, models: dict[str, Path],
    release: tuple[str, list[int], tuple[int, int], Status],
) -> None:  # fmt: skip
    version, majors, cc, status = release
    install_flash_attn_4(monkeypatch, tmp_path, version, majors)
    fake_hw.nvidia(FakeGpu(name="NVIDIA GeForce RTX 5090" if cc[0] == 12 else "NVIDIA H100", cc=cc))
    row = advise(str(models["qwen3"]), dtype="bfloat16").row("flash_attention_4")
    assert row.status == status, row
    if status is Status.WONT:
        assert f"flash-attn-4 {version} runs on compute capability 9.x, 10.x, 11.x only" in row.reason
        assert row.fix == "pip install -U 'flash-attn-4>=4.0.0b5'"


def test_a_gpu_nbhw_cant_see_is_advised_what_works_everywhere(
    fake_hw: FakeHardware, monkeypatch: pytest.MonkeyPatch, models: dict[str, Path]
) -> None:
    """max_memory={0: ...} on a machine without a GPU: flash attention and Hub kernels depend on which GPU it is."""
    import nbhw

    fake_hw.no_nvml_library()
    fake_kernels_package(monkeypatch)  # the Hub kernel fallback is there, as transformers 5.25 requires
    model = str(models["qwen3"])
    row = advise(model, device="cuda:0").row("flash_attention_3")
    assert row.status == Status.DEPENDS and "not here to check" in row.reason and "sdpa" in row.reason
    assert row.fix is not None and "target=" in row.fix
    assert advise(model, device="cuda:0").row("sdpa").status == Status.WORKS
    # The plan says the same as a problem, and the solver takes what works everywhere.
    plan = nbhw.plan(model, max_memory={0: "24GiB"}, attn_implementation="flash_attention_3")
    assert any("flash_attention_3" in p and "not here to check" in p for p in plan.check())
    found = nbhw.fit(model, max_memory={0: "24GiB"}, context=256, offline=True)
    assert found.plan is not None and 'attn_implementation="sdpa"' in found.plan.code
    # With the hardware named, the target's own rules answer.
    assert advise(model, target="RTX 5090").row("flash_attention_3").status != Status.DEPENDS
