"""The emitted cell: valid Python for any model string, the string kept exactly, only the arguments that matter."""

from __future__ import annotations

import ast
import contextlib
import io
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nbhw
from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.plan import codegen
from nbhw.core.plan.arguments import PlanArgs

AUTO_CLASSES = [name for name, _ in __import__("nbhw.core.hf.meta_build", fromlist=["x"]).AUTO_CLASSES] + ["AutoModel"]
# Any text, lone surrogates and control characters included.
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=60)
SIZES = st.one_of(st.integers(0, 10**13), st.sampled_from(["70GiB", "512MiB", "1.5GB", "80 GB"]))


def _assign(tree: ast.Module, name: str) -> Any:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
    raise AssertionError(f"no assignment to {name}")


def _from_pretrained_kwargs(source: str) -> dict[str, str]:
    call = _assign(ast.parse(source), "model")
    assert isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "from_pretrained"
    return {k.arg: ast.unparse(k.value) for k in call.keywords if k.arg}


args_strategy = st.builds(
    PlanArgs,
    device_map=st.one_of(
        st.none(),
        st.sampled_from(["auto", "balanced", "sequential", "cpu", "cuda:1", "mps"]),
        st.integers(0, 7),
        st.dictionaries(ANY_TEXT, st.one_of(st.integers(0, 7), st.sampled_from(["cpu", "disk"])), min_size=1),
    ),
    dtype=st.sampled_from(["auto", "float32", "bfloat16", "float16"]),
    attn_implementation=st.one_of(st.none(), ANY_TEXT),
    use_kernels=st.booleans(),
    quantization=st.sampled_from([None, "4bit", "8bit"]),
    max_memory=st.one_of(
        st.none(), st.dictionaries(st.one_of(st.integers(0, 7), st.sampled_from(["cpu", "disk"])), SIZES, min_size=1)
    ),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=ANY_TEXT,
    args=args_strategy,
    auto_class=st.sampled_from(AUTO_CLASSES),
    config_dtype=st.sampled_from([None, "float32", "bfloat16"]),
)
def test_emitted_code_parses_and_keeps_every_string_exactly(
    model: str, args: PlanArgs, auto_class: str, config_dtype: str | None
) -> None:
    arguments = codegen.call_arguments(args, config_dtype=config_dtype, default_device="cpu")
    source = codegen.cell(model, auto_class, arguments)
    tree = ast.parse(source)
    assert ast.literal_eval(_assign(tree, "model_id")) == model
    kwargs = _from_pretrained_kwargs(source)
    assert "torch_dtype" not in kwargs
    if args.attn_implementation is not None:
        assert ast.literal_eval(kwargs["attn_implementation"]) == args.attn_implementation
    if args.max_memory is not None:
        assert ast.literal_eval(kwargs["max_memory"]) == args.max_memory
    on_cpu_anyway = args.device_map in ("cpu", {"": "cpu"}) and args.quantization is None
    assert ("device_map" in kwargs) == (args.device_map is not None and not on_cpu_anyway)
    if "device_map" in kwargs:
        assert ast.literal_eval(kwargs["device_map"]) == args.device_map
    assert ("dtype" in kwargs) == (args.dtype not in ("auto", config_dtype))
    imported = {a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert auto_class in imported and ("BitsAndBytesConfig" in imported) == (args.quantization is not None)


def test_only_arguments_that_change_what_transformers_does_are_written() -> None:
    tiny = str(tiny_model_path())
    assert _from_pretrained_kwargs(nbhw.plan(tiny).code) == {"device_map": "'auto'"}
    assert _from_pretrained_kwargs(nbhw.plan(tiny, device_map=None).code) == {}
    # The tiny model's config says float32, which dtype="auto" already picks; cpu is where no device_map loads.
    same = nbhw.plan(tiny, dtype="float32", device_map="cpu")
    assert _from_pretrained_kwargs(same.code) == {}
    assert any("config's own dtype" in n for n in same.notes) and any("without one" in n for n in same.notes)
    full = nbhw.plan(
        tiny,
        dtype="bfloat16",
        device_map="sequential",
        attn_implementation="eager",
        use_kernels=True,
        quantization="4bit",
        max_memory={0: "70GiB", "cpu": "200GiB"},
    )
    assert _from_pretrained_kwargs(full.code) == {
        "dtype": "torch.bfloat16",
        "device_map": "'sequential'",
        "max_memory": "{0: '70GiB', 'cpu': '200GiB'}",
        "attn_implementation": "'eager'",
        "use_kernels": "True",
        "quantization_config": "BitsAndBytesConfig(load_in_4bit=True)",
    }
    assert full.code.startswith(
        "import torch\nfrom transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig\n"
    )


def test_code_is_laid_out_like_a_person_writes_it() -> None:
    short = nbhw.plan("acme/m", device_map=None, offline=True).code
    assert "model = AutoModelForCausalLM.from_pretrained(model_id)\n" in short
    long = nbhw.plan("acme/m", dtype="bfloat16", attn_implementation="sdpa", offline=True).code
    assert '    dtype=torch.bfloat16,\n    device_map="auto",\n    attn_implementation="sdpa",\n)\n' in long
    assert all(len(line) <= codegen.WIDTH for line in long.splitlines())


@pytest.mark.parametrize("name", ['it\'s "quoted"', "back\\slash and ünïcødé 模型", "two words"])
def test_cell_for_a_folder_with_an_awkward_name_loads_and_generates(tmp_path: Path, name: str) -> None:
    folder = tmp_path / name
    shutil.copytree(tiny_model_path(), folder)
    plan = nbhw.plan(str(folder), dtype="bfloat16")
    assert plan.check() == []
    namespace: dict[str, Any] = {}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(plan.code, "<nbhw cell>", "exec"), namespace)
    assert namespace["model_id"] == str(folder)
    assert namespace["outputs"].shape[1] > namespace["inputs"]["input_ids"].shape[1] and out.getvalue().strip()


def test_plan_renders_as_escaped_html_and_as_text(tmp_path: Path) -> None:
    folder = tmp_path / "<b>bold</b> & co"
    shutil.copytree(tiny_model_path(), folder)
    plan = nbhw.plan(str(folder), max_memory={0: "400KB", 1: "400KB"})
    bundle = plan._repr_mimebundle_()
    assert bundle["text/plain"] == plan.text() == str(plan)
    html = bundle["text/html"]
    assert "<b>bold</b>" not in html and "&lt;b&gt;bold&lt;/b&gt; &amp; co" in html
    assert "split across 2 devices" in html and "Estimate" in html and 'class="nbhw-code"' in html
    assert "from_pretrained" not in plan.view(code=False)._repr_mimebundle_()["text/html"]
