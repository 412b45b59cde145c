"""nbhw.quantization(): one row per method the installed transformers knows, each gate read from its own code.

Nothing here is a copy of transformers' rules: a quantizer registered or changed at run time changes the advice.
"""

from __future__ import annotations

import ast
import copy
import importlib
import importlib.util
import inspect
import json
import re
import subprocess
import sys
from typing import Any

import pytest
import torch
from IPython.core.error import UsageError
from transformers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING, AUTO_QUANTIZER_MAPPING

import nbhw
from nbhw.core.advice import quantization as Q
from nbhw.core.advice.quantization_methods import Loads, loads, methods, plan_words
from nbhw.core.advice.status import Status
from nbhw.core.hf import meta_build, model_config
from tests.support.dists import QUANTIZATION_DISTS

PACKAGES = {"torchao": "torchao", "quanto": "optimum.quanto", "bitsandbytes_4bit": "bitsandbytes"}


def installed(method: str) -> bool:
    module = PACKAGES.get(method.replace("8bit", "4bit"))
    return module is not None and importlib.util.find_spec(module.split(".")[0]) is not None


@pytest.fixture(scope="module")
def on_t4(tiny_llama: str) -> Q.QuantizationAdvice:
    return nbhw.quantization(tiny_llama, target="T4", dtype="bfloat16")


def kernels_here() -> bool:
    """transformers' own answer: kernels installed in its accepted range (5.25 requires the package)."""
    from transformers.utils import is_kernels_available

    return bool(is_kernels_available())


def hub_repo(module: str) -> str:
    """The Hub kernel repository an integration module of the installed transformers loads with get_kernel."""
    source = inspect.getsource(importlib.import_module(module))
    m = re.search(r"get_kernel\(\s*[\"']([^\"']+/[^\"']+)[\"']", source)
    assert m, f"{module} loads no Hub kernel by name"
    return m.group(1)


@pytest.fixture(scope="module")
def on_t4_without_kernels(tiny_llama: str) -> Q.QuantizationAdvice:
    """The T4 advice as on a machine where transformers finds no usable kernels package (none, or one outside its
    accepted range: 5.24's default install): every transformers module's is_kernels_available answers False while
    the advice is read, and only then."""
    from transformers.utils import import_utils

    real = import_utils.is_kernels_available
    with pytest.MonkeyPatch.context() as mp:
        for module in [m for name, m in list(sys.modules.items()) if name.startswith("transformers")]:
            if getattr(module, "is_kernels_available", None) is real:
                mp.setattr(module, "is_kernels_available", lambda *a, **k: False)
        return nbhw.quantization(tiny_llama, target="T4", dtype="bfloat16")


def test_the_test_environment_has_at_least_two_quantization_packages() -> None:
    # The test extra installs optimum-quanto; scripts/setup.sh test sets bitsandbytes and torchao up beside the venv
    # (tests/support/dists.py), where tests/core/advice/test_quant_loads.py loads them for real in a child process.
    assert installed("quanto"), "pip install -e '.[test]' installs optimum-quanto"
    beside = {m for m, folder in QUANTIZATION_DISTS.items() if folder.is_dir() or importlib.util.find_spec(m)}
    assert len({"quanto"} | beside) >= 2, "scripts/setup.sh test sets up bitsandbytes and torchao beside the venv"


def test_one_row_per_method_transformers_knows(on_t4: Q.QuantizationAdvice) -> None:
    assert [r.method for r in on_t4.rows] == list(AUTO_QUANTIZER_MAPPING)
    assert {type(g.status) for r in on_t4.rows for g in (r.here, r.target) if g is not None} == {Status}
    assert json.dumps(on_t4.to_dict())


def test_how_each_method_loads_is_read_from_transformers_code() -> None:
    assert loads("awq")[0] is Loads.PREQUANTIZED  # requires_calibration
    assert loads("bitsandbytes_4bit")[0] is Loads.ON_LOAD
    assert loads("gguf")[0] is Loads.FILE_FORMAT
    assert loads("gptq")[0] is Loads.CALIBRATED
    assert loads("hqq")[0] is Loads.NO_OPS  # 5.24's HqqHfQuantizer has no get_quantize_ops


@pytest.fixture
def new_method() -> Any:
    """A quantization method transformers didn't have when nbhw was written, registered the way a release adds one."""
    from transformers.quantizers.auto import register_quantizer
    from transformers.quantizers.base import HfQuantizer
    from transformers.utils.quantization_config import QuantoConfig

    @register_quantizer("nbhw_new_method")
    class NewQuantizer(HfQuantizer):  # type: ignore[misc]
        def validate_environment(self, *args: Any, **kwargs: Any) -> None:
            if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 12:
                raise ValueError("nbhw_new_method needs compute capability >= 12.0")

        def get_quantize_ops(self) -> Any:  # quantizes on load
            return None

        def is_serializable(self) -> bool:
            return True

        @property
        def is_trainable(self) -> bool:
            return False

    AUTO_QUANTIZATION_CONFIG_MAPPING["nbhw_new_method"] = QuantoConfig
    yield "nbhw_new_method"
    del AUTO_QUANTIZER_MAPPING["nbhw_new_method"], AUTO_QUANTIZATION_CONFIG_MAPPING["nbhw_new_method"]


def test_a_method_transformers_adds_is_a_row_whose_gate_is_its_own_code(new_method: str) -> None:
    assert new_method in methods() and new_method in plan_words()
    on_h100 = nbhw.quantization(target="H100").row(new_method).target
    on_5090 = nbhw.quantization(target="RTX 5090").row(new_method).target
    assert on_h100 is not None and on_h100.status is Status.WONT and "compute capability >= 12.0" in on_h100.why
    assert on_5090 is not None and on_5090.status is not Status.WONT  # sm_120 passes its check


def test_a_changed_quantizer_changes_the_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    before = nbhw.quantization(target="H100").row("fbgemm_fp8").target
    assert before is not None and before.status is Status.PACKAGE  # Hopper passes; fbgemm-gpu is to install
    cls = AUTO_QUANTIZER_MAPPING["fbgemm_fp8"]

    def validate_environment(self: Any, *args: Any, **kwargs: Any) -> None:
        major, _ = torch.cuda.get_device_capability()
        if major < 10:
            raise ValueError("FP8 fbgemm now needs compute capability >= 10.0")

    monkeypatch.setattr(cls, "validate_environment", validate_environment)
    after = nbhw.quantization(target="H100").row("fbgemm_fp8").target
    assert after is not None and after.status is Status.WONT and "compute capability >= 10.0" in after.why


@pytest.mark.parametrize(
    ("method", "status", "words"),
    [
        pytest.param(
            "bitsandbytes_4bit",
            Status.WORKS,
            "checks pass",
            marks=pytest.mark.skipif(not installed("bitsandbytes_4bit"), reason="its check imports bitsandbytes"),
        ),
        ("fp8", Status.DEQUANTIZED, "compute capability >= 8.9"),
        ("fbgemm_fp8", Status.WONT, "compute capability >= 9.0"),
        ("nvfp4", Status.WONT, "found sm75"),
        ("metal", Status.WONT, "Apple Silicon"),
        # read where transformers finds no kernels package (on_t4_without_kernels): the package is named
        ("eetq", Status.PACKAGE, "once the packages are installed"),
        pytest.param(
            "eetq",
            Status.WORKS,
            "checks pass on 1x T4; the load fetches kernels-community/quantization-eetq from the Hub",
            marks=pytest.mark.skipif(not kernels_here(), reason="transformers finds no usable kernels package here"),
        ),
        ("hqq", Status.WONT, "no get_quantize_ops"),
    ],
)
def test_t4_gates_come_from_transformers(
    on_t4: Q.QuantizationAdvice, request: pytest.FixtureRequest, method: str, status: Status, words: str
) -> None:
    # A row expected to name a package is read where transformers finds none (5.25 requires kernels, so here
    # that is its kernels check answering False); every other row as this machine's transformers answers.
    advice: Q.QuantizationAdvice = (
        request.getfixturevalue("on_t4_without_kernels") if status is Status.PACKAGE else on_t4
    )
    g = advice.row(method).target
    assert g is not None and g.status is status and words in g.why, (g.status, g.why)


def test_the_fix_names_the_package_transformers_asks_for(
    on_t4: Q.QuantizationAdvice, on_t4_without_kernels: Q.QuantizationAdvice
) -> None:
    assert on_t4_without_kernels.row("eetq").shown.fix == "pip install kernels"
    assert on_t4.row("eetq").shown.fix == (None if kernels_here() else "pip install kernels")
    assert "pip install gptqmodel" in (on_t4.row("awq").here.fix or "")
    assert on_t4.row("fbgemm_fp8").shown.fix.startswith("a GPU with compute capability >= 9.0")  # type: ignore[union-attr]


def test_a_method_whose_check_asks_for_kernels_names_the_hub_kernel_its_load_fetches(
    on_t4: Q.QuantizationAdvice, on_t4_without_kernels: Q.QuantizationAdvice
) -> None:
    repo = hub_repo("transformers.integrations.eetq")  # what the installed transformers' EETQ layers load
    for advice in (on_t4, on_t4_without_kernels):
        g = advice.row("eetq").target
        assert g is not None and g.downloads == [repo] and f"fetches {repo} from the Hub" in g.why, g
        assert any("known only then" in n for n in g.notes), g.notes  # a build for the T4: not claimed
    quanto = on_t4.row("quanto").target  # its check asks for no kernels: nothing fetched, nothing said
    assert quanto is not None and quanto.downloads == [] and "Hub" not in quanto.why


def test_the_target_changes_the_verdict_not_the_method_list() -> None:
    # Where transformers' check passes but for the kernels package: "needs a package" without it, "works" (with the
    # Hub kernel its load fetches) once it is installed, as transformers 5.25 requires.
    passes = Status.WORKS if kernels_here() else Status.PACKAGE
    b200 = nbhw.quantization(target="B200").row("nvfp4").target
    assert b200 is not None and b200.status is passes, b200  # Blackwell, one CUDA device: the device checks pass
    assert b200.downloads, b200  # its load fetches a Hub kernel, installed or not: the why says so
    two = nbhw.quantization(target="2x B200").row("nvfp4").target
    assert two is not None and two.status is Status.WONT  # transformers refuses device_map="auto"
    bnb = nbhw.quantization(target="TPU v5e").row("bitsandbytes_4bit").target
    assert bnb is not None and bnb.status is Status.WONT and "no tpu backend" in bnb.why
    assert "bitsandbytes" in bnb.source  # written from bitsandbytes' own device list, and it says so
    metal = nbhw.quantization(target="M3 Max 128GB").row("metal").target
    assert metal is not None and metal.status is passes, metal  # MPS passes
    here = nbhw.quantization().row("metal").here
    assert here.status is Status.WONT and "MPS" in here.why  # this machine has no MPS: the same method won't work


@pytest.mark.parametrize(
    ("target", "device_map"),
    [("T4", '"cuda:0"'), ("2x A100 80GB", '"auto"'), ("M4 Max", '"mps"'), ("Gaudi 2", '"hpu:0"')],
)
def test_every_cell_is_valid_python_with_the_targets_device_strings(target: str, device_map: str) -> None:
    advice = nbhw.quantization(target=target)
    for row in advice.rows:
        ast.parse(row.code)
        assert f"device_map={device_map}" in row.code, (row.method, row.code)
    t4_bnb = nbhw.quantization(target="T4").row("bitsandbytes_4bit").config
    assert "bnb_4bit_compute_dtype=torch.float16" in t4_bnb  # the T4's advised dtype, not bfloat16


def _dry_run(config_of_model: Any, code: str) -> None:
    """transformers' own path with the cell's config: get_hf_quantizer, update_dtype, meta build, preprocess_model."""
    from transformers.quantizers.auto import get_hf_quantizer

    lines = [
        line for line in code.splitlines() if "from_pretrained(" not in line and not line.startswith(("    ", ")"))
    ]
    namespace: dict[str, Any] = {}
    exec("\n".join(lines), namespace)
    cfg = copy.deepcopy(config_of_model)
    with meta_build.quiet():
        q, cfg, device_map = get_hf_quantizer(
            cfg, namespace["quantization_config"], {"": torch.device("cpu")}, True, {}
        )
        dtype = q.update_dtype(torch.bfloat16)
        built = meta_build.build(cfg, dtype="bfloat16")
        assert built.ok and built.model is not None
        q.preprocess_model(model=built.model, dtype=dtype, device_map=device_map, checkpoint_files=None)


def test_the_dry_run_accepts_the_cell_of_every_method_whose_package_is_installed(tiny_llama: str) -> None:
    here = nbhw.quantization(tiny_llama, dtype="bfloat16")
    config_of_model = model_config.load(tiny_llama, offline=True).config
    checked = []
    for row in here.rows:
        if row.loads is Loads.ON_LOAD and row.here.status is Status.WORKS:
            _dry_run(config_of_model, row.code)
            checked.append(row.method)
    assert {m for m in PACKAGES if installed(m)} <= set(checked), checked


def test_a_prequantized_checkpoint_says_its_method_and_where_it_runs(tiny_llama: str) -> None:
    from nbhw.core.advice.attention_rules import catalog_target
    from nbhw.core.hardware.targets import parse_target

    cfg = copy.deepcopy(model_config.load(tiny_llama, offline=True).config)
    cfg.quantization_config = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    here = Q.where_for(Q.here_target(), "bfloat16")
    verdict = Q.checkpoint_verdict(cfg, here, Q.where_for(catalog_target(parse_target("H100"))))
    assert verdict is not None and verdict.method == "fp8"
    assert verdict.here.status is Status.DEQUANTIZED  # no GPU here: transformers dequantizes to bf16
    assert verdict.target is not None and verdict.target.status is Status.WORKS
    cfg.quantization_config = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    found = Q.checkpoint_verdict(cfg, here, None)
    assert found is not None and found.method == "bitsandbytes_4bit"


def test_weight_bytes_say_how_they_were_computed(on_t4: Q.QuantizationAdvice) -> None:
    def source(method: str) -> str:
        size = on_t4.row(method).size
        assert size is not None
        return size.source

    assert "transformers' quantized_element_size" in source("bitsandbytes_4bit") and "absmax" in source(
        "bitsandbytes_4bit"
    )
    assert "4 bits per weight (the config's bits=4)" in source("awq") and "scales not counted" in source("awq")
    assert on_t4.row("vptq").size is not None and on_t4.row("vptq").size.bytes is None  # type: ignore[union-attr]
    assert "dequantizes" in source("fp8")  # fp8 on a T4 loads unquantized: its bytes are the unquantized model's


def test_every_view_says_it_plans_for_hardware_that_is_not_here(on_t4: Q.QuantizationAdvice) -> None:
    assert on_t4.text().startswith("planning for 1x T4: hardware that is not here")
    assert "hardware that is not here" in on_t4.html() and "<table" in on_t4.html()
    assert "not here" not in nbhw.quantization().text().splitlines()[0]


# ---------------------------------------------------------------- the plan takes every method


def test_the_plan_takes_any_method_transformers_quantizes_on_load_and_writes_its_config() -> None:
    plan = nbhw.plan(quantization="quanto", dtype="bfloat16")
    assert 'quantization_config=QuantoConfig(weights="int8")' in plan.code
    assert "from transformers import AutoModelForCausalLM, AutoTokenizer, QuantoConfig" in plan.code
    ast.parse(plan.code)
    assert nbhw.plan(quantization="bitsandbytes_4bit").args.quantization == "4bit"  # the old word stays the word
    with pytest.raises(nbhw.UserError) as err:
        nbhw.plan(quantization="awq")
    assert "pre-quantized checkpoints only" in str(err.value) and "valid: 4bit, 8bit" in str(err.value)
    with pytest.raises(nbhw.UserError, match=r"unknown quantization 'int3'; valid: 4bit, 8bit, .*torchao"):
        nbhw.plan(quantization="int3")


def test_a_plan_for_a_target_checks_its_quantization_as_if_on_it() -> None:
    refused = nbhw.plan(quantization="fbgemm_fp8", target="T4", dtype="float16").check()
    assert any("on the T4: won't work" in p and "compute capability >= 9.0" in p for p in refused), refused
    h100 = nbhw.plan(quantization="fbgemm_fp8", target="H100", dtype="bfloat16")
    assert h100.check() == [] and any("needs a package" in n for n in h100.notes)


def test_the_magic_and_the_cli_show_the_rows(ip: Any, capsys: Any, tiny_llama: str) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("hw", f"quantization {tiny_llama} --target T4 --json")
    data = json.loads(capsys.readouterr().out)
    assert len(data["rows"]) == len(AUTO_QUANTIZER_MAPPING) and data["target"] == "1x T4"
    with pytest.raises(UsageError, match="unknown target 'T5'"):
        ip.run_line_magic("hw", "quantization --target T5")
    proc = subprocess.run(
        [sys.executable, "-m", "nbhw", "quantization", "--target", "MI300X"], capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.startswith("planning for 1x MI300X: hardware that is not here")


# ---------------------------------------------------------------- GPTQ on a CPU: transformers' own gate


def gptqmodel_present(mp: pytest.MonkeyPatch, version: str = "5.0.0") -> None:
    """gptqmodel installed, at the boundary transformers' GPTQ check reads: its package check and its metadata."""
    from importlib import metadata

    from transformers.quantizers import quantizer_gptq

    real = metadata.version
    mp.setattr(quantizer_gptq, "is_gptqmodel_available", lambda: True)
    mp.setattr(metadata, "version", lambda name: version if name in {"gptqmodel", "optimum"} else real(name))


def transformers_gptq_gate() -> str | None:
    """transformers' own GPTQ check on this CPU machine: its refusal, or None when it passes."""
    from transformers import GPTQConfig
    from transformers.quantizers.quantizer_gptq import GptqHfQuantizer

    q = object.__new__(GptqHfQuantizer)  # __init__ needs optimum.gptq; validate_environment reads no more than this
    q.quantization_config, q.pre_quantized = GPTQConfig(bits=4), False
    try:
        q.validate_environment(device_map="cpu")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def test_gptq_on_a_cpu_needs_a_package_not_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("gptqmodel") is not None or torch.cuda.is_available():
        pytest.skip("gptqmodel or a GPU is here: the CPU-without-gptqmodel case is not")
    # transformers' own check refuses this CPU only for want of gptqmodel: with it present, the same code passes.
    assert transformers_gptq_gate() == "RuntimeError: GPU is required to quantize or run quantize model."
    with pytest.MonkeyPatch.context() as mp:
        gptqmodel_present(mp)
        assert transformers_gptq_gate() is None
    # nbhw's row says so, as its AWQ row (the same package) does: a package, not a GPU.
    row = nbhw.quantization().row("gptq").here
    assert row.status is Status.PACKAGE and row.status is nbhw.quantization().row("awq").here.status, row
    assert "pip install gptqmodel" in (row.fix or "") and "GPU" not in (row.fix or "") + row.why
    # With gptqmodel present, the row no longer asks for it (optimum's gptq module is still missing here).
    gptqmodel_present(monkeypatch)
    present = nbhw.quantization().row("gptq").here
    assert present.status is Status.PACKAGE and "gptqmodel" not in (present.fix or ""), present
    assert "pip install optimum" in (present.fix or "")
