"""Every private or internal name of torch, transformers, accelerate and the notebook stack that nbhw touches.

Each entry says where it lives, what nbhw reads it for, how (an attribute it calls or reads, a class flag, or a
function whose source nbhw parses with ``ast``), and the version it was read from.
``tests/core/hf/test_private_names.py`` checks that each one still exists in the installed libraries, so an upgrade
that renames one fails there, by name, rather than somewhere in a plan. A name that exists only in some releases says
which (``versions``, a PEP 440 specifier of its library's versions): it is checked where such a release is installed
(the compatibility run's sets for transformers, tests/core/hardware/test_doctor.py's kernels 0.17.2 wheel for
kernels < 0.19), and nbhw's code that reads it finds it where it is, or says it could not tell.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion

from nbhw.core.hf.library_source import function_source, library_file

How = Literal["call", "read", "patch", "flag", "source"]


@dataclass(frozen=True)
class PrivateName:
    """One internal name: ``module`` + ``attribute`` (dotted inside the module), why nbhw needs it, and how.

    A part written ``Class()`` in ``attribute`` means an instance of that class (an attribute its __init__ sets);
    ``Class(arg, key=value)`` one made with those literal arguments (written without dots), for a class whose
    __init__ needs some. ``versions`` is the PEP 440 specifier of the library versions the name exists in ("":
    every version nbhw supports).
    """

    module: str
    attribute: str
    why: str
    how: How
    read_from: str
    only: str | None = (
        None  # where the name exists at all (a CUDA build of torch, an optional package); None: everywhere
    )
    versions: str = ""

    @property
    def parts(self) -> list[str]:
        """The names in the dotted path, without the calls: ("PreTrainedModel", "_supports_sdpa")."""
        return [re.sub(r"\(.*\)$", "", part) for part in (*self.module.split("."), *self.attribute.split("."))]

    @property
    def path(self) -> str:
        """The full dotted name."""
        return f"{self.module}.{self.attribute}"

    @property
    def library(self) -> str:
        """The distribution the name belongs to."""
        return self.module.split(".")[0]


def _n(
    module: str, attribute: str, how: How, read_from: str, why: str, *, only: str | None = None, versions: str = ""
) -> PrivateName:
    return PrivateName(module, attribute, why, how, read_from, only, versions)


CUDA_BUILD = "a CUDA build of torch"
MEM = "torch.distributed._tools.mem_tracker"
GEN = "transformers.generation.utils"


TORCH = "2.13.0"
BNB = "bitsandbytes"  # optional: checked where installed (only=BNB)
BNB_V = "0.50.2"
KERNELS_V = "0.17.2"
KERNELS_V19 = "0.19.1"
KV = "kernels.variants"  # kernels < 0.19 (0.17.2 and 0.18.3 read)
KV19 = "kernels._internals.variants"  # kernels 0.19 moved its modules under kernels._internals
OLD_KERNELS, KERNELS19 = "<0.19", ">=0.19"
TF = "transformers"
TF_V = "5.24.0"
TF_V25 = "5.25.0"
HUB_KERNELS = f"{TF}.integrations.hub_kernels"
ACCELERATE = "1.15.0"
PEFT_V = "0.21.2"

PRIVATE_NAMES: tuple[PrivateName, ...] = (
    # torch: what the build supports, read without creating a CUDA context
    _n("torch._C", "_cudnn", "call", TORCH, "cuDNN's version without per-GPU checks", only=CUDA_BUILD),
    _n("torch.cuda", "_parse_visible_devices", "call", TORCH, "CUDA_VISIBLE_DEVICES as torch parses it"),
    _n("torch.cuda", "_transform_uuid_to_ordinals", "call", TORCH, "GPU-UUID entries of CUDA_VISIBLE_DEVICES"),
    _n("torch.xpu", "_is_compiled", "call", TORCH, "whether this torch was built with XPU support"),
    # torch: the run planner's dry run (nbhw/core/hf/dryrun.py): MemTracker's storage accounting, lean
    _n(f"{MEM}", "MemTracker", "call", TORCH, "the tracker a dry run subclasses (a private module of torch)"),
    _n(f"{MEM}", "MemTracker._track", "call", TORCH, "count an op's output storages, each once"),
    _n(f"{MEM}", "MemTracker._update_snap", "patch", TORCH, "totals per planned device instead of per torch device"),
    _n(f"{MEM}", "MemTracker()._WINFO", "read", TORCH, "storage -> its info: the device a tensor is counted on"),
    _n(f"{MEM}", "_MemRefType", "read", TORCH, "the category outputs are tracked under"),
    _n(f"{MEM}", "_UpdateType", "read", TORCH, "add / delete / resize in _update_snap"),
    _n("torch.utils._python_dispatch", "TorchDispatchMode", "call", TORCH, "enter the mode without MemTracker's hooks"),
    _n("torch.utils._python_dispatch", "_disable_current_modes", "call", TORCH, "ask CPU SDPA's selector aside"),
    _n("torch._ops", "OpOverload", "read", TORCH, "which ops the meta-kernel memo may remember"),
    _n(
        "torch", "ops.aten.add.default._schema", "read", TORCH, "an op's schema: views and in-place ops aren't memoised"
    ),
    _n("torch", "UntypedStorage._cdata", "read", TORCH, "a storage's identity: each counted once"),
    _n("torch.distributed.tensor", "DTensor._local_tensor", "read", TORCH, "a shard's own tensor: FSDP2's step on it"),
    _n("torch", "ops.aten._local_scalar_dense.default", "read", TORCH, ".item() on a meta tensor that carries values"),
    _n("torch", "_fused_sdp_choice", "call", TORCH, "the SDPA kernel CPU torch picks, asked with 2-token stand-ins"),
    _n("torch", "_grouped_mm", "read", TORCH, "MoE grouped_mm on meta: routed to transformers' fallback op"),
    _n("torch", "ops.aten._safe_softmax", "read", TORCH, "the math path's softmax: its two hidden buffers replayed"),
    _n("torch", "ops.aten._scaled_dot_product_flash_attention_for_cpu", "call", TORCH, "CPU flash SDPA meta"),
    _n("torch", "ops.aten._scaled_dot_product_flash_attention", "call", TORCH, "CUDA flash SDPA's meta kernel"),
    _n(
        "torch",
        "ops.aten._scaled_dot_product_efficient_attention",
        "call",
        TORCH,
        "memory-efficient SDPA's meta kernel",
    ),
    # transformers: generate()'s own steps, run by the dry run in its order (nbhw/core/plan/run.py)
    _n(TF, "PreTrainedModel._get_dtype_plan", "call", TF_V, "the dtype plan from_pretrained applies (fp32 modules)"),
    _n(TF, "PreTrainedModel._from_config", "call", TF_V, "the few-layer model a deep model's dry run records"),
    _n(f"{TF}.core_model_loading", "build_glob_alternation", "call", TF_V, "from_pretrained's matcher of the plan"),
    _n(GEN, "GenerationMixin._prepare_generation_config", "call", TF_V, "generate()'s merge of generation options"),
    _n(GEN, "GenerationMixin._prepare_cache_for_generation", "call", TF_V, "the cache generate() creates"),
    _n(GEN, "GenerationMixin._prepare_special_tokens", "call", TF_V, "generate()'s special-token tensors"),
    _n(GEN, "GenerationMixin._maybe_prepare_encoder_kwargs_for_generation", "call", TF_V, "the encoder's run"),
    _n(GEN, "GenerationMixin._prepare_position_ids_for_generation", "call", TF_V, "position ids from the mask"),
    _n(GEN, "GenerationMixin._supports_logits_to_keep", "call", TF_V, "generate() computes the last logits only"),
    _n(GEN, "GenerationMixin._get_logits_processor", "call", TF_V, "continuous batching's logit processors (serve)"),
    _n(
        GEN,
        "GenerationMixin.generate",
        "read",
        TF_V,
        "the OOM report reads its frame's locals input_ids and "
        "generation_config (max_length set) to know which run ran out",
    ),
    _n(GEN, "GenerationMixin._prefill", "source", TF_V, "the prefill forward; reads GenerationConfig._mask_length"),
    _n(GEN, "GenerationMixin._update_model_kwargs_for_generation", "call", TF_V, "kwargs between two steps"),
    # transformers: the decisions from_pretrained makes, asked of transformers itself
    _n(f"{TF}.integrations.accelerate", "_get_device_map", "call", TF_V, "device_map='auto' and the strategies"),
    _n(f"{TF}.integrations.accelerate", "accelerate_max_memory", "patch", TF_V, "NVML's free memory, no context"),
    _n(HUB_KERNELS, "_build_kernel_mapping", "source", TF_V, "use_kernels' default mapping"),
    # the USE_HUB_KERNELS switch: read once at import before 5.25 (a bool and the value read), at each load since
    _n(HUB_KERNELS, "_TRANSFORMERS_USE_HUB_KERNELS", "read", TF_V, "USE_HUB_KERNELS as read", versions="<5.25"),
    _n(HUB_KERNELS, "_kernels_enabled", "read", TF_V, "USE_HUB_KERNELS on (a bool)", versions="<5.25"),
    _n(HUB_KERNELS, "_kernels_enabled", "call", TF_V25, "USE_HUB_KERNELS on, asked now", versions=">=5.25"),
    _n(f"{TF}.models.auto.auto_factory", "_BaseAutoModelClass._model_mapping", "read", TF_V, "Auto class to class"),
    _n(TF, "PreTrainedModel._supports_sdpa", "flag", TF_V, "the class supports sdpa"),
    _n(TF, "PreTrainedModel._supports_flash_attn", "flag", TF_V, "the class supports flash attention"),
    _n(TF, "PreTrainedModel._supports_flex_attn", "flag", TF_V, "the class supports flex_attention"),
    _n(TF, "PreTrainedModel._compatible_flash_implementations", "flag", TF_V, "flash implementations it switches to"),
    _n(TF, "PreTrainedModel._no_split_modules", "flag", TF_V, "what 'a layer' is for placement"),
    _n(TF, "PreTrainedModel._keep_in_fp32_modules", "flag", TF_V, "modules kept in float32"),
    _n(TF, "PretrainedConfig._attn_implementation", "read", TF_V, "the attention a build resolved to"),
    _n(f"{TF}.training_args", "TrainingArguments._setup_devices", "source", TF_V, "TrainingArguments' device order"),
    _n(f"{TF}.pipelines.base", "Pipeline.__init__", "source", TF_V, "pipeline()'s device order"),
    _n(f"{TF}.utils.import_utils", "KERNELS_MIN_VERSION", "read", TF_V, "the kernels versions accepted"),
    _n(f"{TF}.utils.import_utils", "KERNELS_MAX_VERSION", "read", TF_V, "the kernels versions accepted"),
    _n(f"{TF}.utils.import_utils", "BITSANDBYTES_MIN_VERSION", "read", TF_V, "the bitsandbytes versions accepted"),
    # transformers: the quantization methods and their gates (nbhw.quantization), the flash-attention check for a target
    _n(f"{TF}.quantizers.auto", "AUTO_QUANTIZER_MAPPING", "read", TF_V, "every quantization method, one row each"),
    _n(f"{TF}.quantizers.auto", "AUTO_QUANTIZATION_CONFIG_MAPPING", "read", TF_V, "each method's config class"),
    _n(f"{TF}.quantizers.base", "HfQuantizer.requires_calibration", "flag", TF_V, "pre-quantized checkpoints only"),
    _n(f"{TF}.quantizers.base", "HfQuantizer.quantized_element_size", "read", TF_V, "bytes per quantized weight"),
    _n(f"{TF}.quantizers.base", "HfQuantizer.get_modules_to_not_convert", "call", TF_V, "weights a method skips"),
    _n(f"{TF}.quantizers.base", "HfQuantizer.get_quantize_ops", "read", TF_V, "a method quantizes on load"),
    _n(f"{TF}.quantizers.base", "HfQuantizer._process_model_after_weight_loading", "source", TF_V, "calibrates"),
    _n(TF, "PreTrainedModel._flash_attn_import_error", "call", TF_V, "flash attention's check, run for a target"),
    _n(f"{TF}.modeling_flash_attention_utils", "FLASH_ATTENTION_COMPATIBILITY_MATRIX", "read", TF_V, "FA rules"),
    # torch: what a loaded quantized model really holds (tensor subclasses' inner tensors)
    _n("torch.utils._python_dispatch", "is_traceable_wrapper_subclass", "call", TORCH, "a tensor subclass"),
    _n(f"{TF}.quantizers.auto", "AUTO_QUANTIZER_MAPPING", "source", TF_V, "the bitsandbytes method names (ast)"),
    # bitsandbytes: its own choice of native library, compiled from its source and run without importing it
    _n(f"{BNB}.cextension", "get_cuda_bnb_library_path", "source", BNB_V, "the library it loads", only=BNB),
    _n(f"{BNB}.cextension", "_find_cuda_libs", "source", BNB_V, "the libraries it ships (called)", only=BNB),
    _n(f"{BNB}.cextension", "_split_cuda_version", "source", BNB_V, "its CUDA version rule (called)", only=BNB),
    _n(f"{BNB}.cextension", "get_xpu_bnb_library_path", "source", BNB_V, "the XPU library it loads", only=BNB),
    _n(BNB, "supported_torch_devices", "source", BNB_V, "the devices transformers lets it quantize for", only=BNB),
    # kernels: its own build-variant resolver, for the Hub kernels in the local cache (package_checks looks in both)
    _n(KV, "get_variants_local", "call", KERNELS_V, "a cached kernel's builds", only="kernels", versions=OLD_KERNELS),
    _n(KV, "resolve_variants", "call", KERNELS_V, "which build it would load", only="kernels", versions=OLD_KERNELS),
    _n(KV, "VariantRejected.reason", "read", KERNELS_V, "why a build is refused", only="kernels", versions=OLD_KERNELS),
    _n(KV19, "get_variants_local", "call", KERNELS_V19, "a cached kernel's builds", only="kernels", versions=KERNELS19),
    _n(KV19, "resolve_variants", "call", KERNELS_V19, "which build it would load", only="kernels", versions=KERNELS19),
    _n(
        KV19,
        "VariantRejected.reason",
        "read",
        KERNELS_V19,
        "why a build is refused",
        only="kernels",
        versions=KERNELS19,
    ),
    # kernels: kernelize's own device check, run for a planned device (nbhw.core.hf.kernel_tables)
    _n(
        "kernels._internals.layer.kernelize",
        "_validate_device_type",
        "call",
        KERNELS_V19,
        "the devices kernelize refuses",
        only="kernels",
        versions=KERNELS19,
    ),
    # kernels: its cache reader, for an offline load's uncached Hub kernels (nbhw.core.hf.kernel_tables)
    _n(
        "kernels._internals._versions",
        "_get_available_versions",
        "call",
        KERNELS_V19,
        "a Hub kernel's versions in the local cache",
        only="kernels",
        versions=KERNELS19,
    ),
    # kernels: the Hub repo of an entry of transformers' default mapping (nbhw.core.hf.kernel_tables)
    _n(
        "kernels",
        "LayerRepository('org/name', layer_name='Layer', version=1)._repo_id",
        "read",
        KERNELS_V19,
        "the Hub repo a use_kernels mapping entry loads",
        only="kernels",
    ),
    # training plans (nbhw/core/train): one real training step on meta, under torch's own tracker
    _n(MEM, "MemTracker._track_module_params_and_buffers", "patch", TORCH, "frozen parameters get no grad hook"),
    _n(MEM, "MemTracker._pre_fw_hook", "patch", TORCH, "a module's second forward (accumulation, step 2)"),
    _n(MEM, "MemTracker._update_peak_stats", "patch", TORCH, "the device-wide peak only (per-module: quadratic)"),
    _n(MEM, "MemTracker()._param_to_grad_hook_handles", "patch", TORCH, "no-op handles for frozen parameters"),
    _n(MEM, "MemTracker()._mod_tracker", "read", TORCH, "forward or backward, and which decoder layer runs"),
    _n(MEM, "MemTracker()._curr_mem_snap", "read", TORCH, "the tracker's totals after each op"),
    _n(MEM, "MemTracker()._peak_mem", "patch", TORCH, "the device-wide peak kept"),
    _n(MEM, "MemTracker()._peak_mem_snap", "patch", TORCH, "the categories at the peak"),
    _n(MEM, "_TOTAL_KEY", "read", TORCH, "the total among the tracker's categories"),
    _n("torch.distributed._tools.mod_tracker", "ModTracker()._known_modules", "read", TORCH, "module -> its name"),
    _n("torch.utils._foreach_utils", "_get_foreach_kernels_supported_devices", "call", TORCH, "foreach on a GPU"),
    _n("torch.testing._internal.distributed.fake_pg", "FakeStore", "call", TORCH, "a fake world of N ranks"),
    _n("torch._subclasses.fake_tensor", "FakeTensorMode", "call", TORCH, "FSDP2's step on fake CPU tensors"),
    _n(
        "torch.distributed.tensor._sharding_prop",
        "ShardingPropagator._propagate_tensor_meta_non_cached",
        "patch",
        TORCH,
        "DTensor's global-shape stand-ins, kept out of the tracker",
    ),
    _n("torch.utils._python_dispatch", "_disable_current_modes", "call", TORCH, "the tracker set aside for them"),
    _n(f"{TF}.masking_utils", "find_packed_sequence_indices", "patch", TF_V, "answered: rows are not packed"),
    _n(TF, "Trainer._mixed_mesh_grad_norm", "call", TF_V, "Trainer's clip of DTensor gradients (TP)"),
    _n(TF, "Trainer.create_optimizer", "call", TF_V, "the optimizer Trainer makes, with a stand-in self"),
    _n(TF, "PreTrainedModel.prepare_distribute_model", "call", TF_V, "the TP mesh from_pretrained makes"),
    _n(TF, "PreTrainedModel.maybe_distribute_model", "call", TF_V, "the TP sharding from_pretrained applies"),
    _n(f"{TF}.distributed.tensor_parallel", "get_kv_heads_per_rank", "call", TF_V, "heads that split over TP ranks"),
    _n(f"{TF}.integrations.peft", "MIN_PEFT_VERSION", "read", TF_V, "the peft floor the fix line names"),
    _n("accelerate.utils.fsdp_utils", "fsdp2_prepare_model", "call", ACCELERATE, "FSDP2 as Trainer applies it"),
    _n(
        "peft.tuners.tuners_utils",
        "_maybe_include_all_linear_layers",
        "call",
        PEFT_V,
        "peft's all-linear rule",
        only="peft",
    ),
    _n(f"{BNB}.nn", "Params4bit._quantize", "call", BNB_V, "QLoRA's 4-bit packing, on meta", only=BNB),
    # accelerate
    _n("accelerate.state", "PartialState._prepare_backend", "source", ACCELERATE, "the distributed backend chosen"),
    _n("accelerate.state", "PartialState.default_device", "source", ACCELERATE, "the device Accelerator() picks"),
    # huggingface_hub
    _n("huggingface_hub.utils._validators", "validate_repo_id", "call", "1.5", "what a Hub model id may look like"),
    _n("huggingface_hub.constants", "HF_HUB_CACHE", "read", "2.4", "where kernels caches Hub kernels"),
    _n("huggingface_hub.constants", "REPO_ID_SEPARATOR", "read", "2.4", "the cache's folder names"),
    _n("huggingface_hub.file_download", "repo_folder_name", "call", "2.4", "a cached repo's folder, by repo type"),
    # torch: what keeps a tensor alive (nbhw.holders): saved tensors read without running unpack hooks
    _n("torch._C", "_autograd.SavedTensor", "read", TORCH, "what a grad_fn node saved"),
    _n("torch._C", "_autograd.SavedTensor.data", "read", TORCH, "the saved tensor, never unpacked"),
    _n("torch._C", "_functions.SinBackward0._raw_saved_self", "read", TORCH, "C++ nodes' _raw_saved_<name>"),
    _n("torch.autograd.function", "BackwardCFunction._raw_saved_tensors", "read", TORCH, "a Function's saved"),
    _n("torch", "Tensor._grad", "read", TORCH, "a leaf's grad without the non-leaf warning"),
    _n("torch", "Tensor._indices", "call", TORCH, "a sparse COO tensor's indices"),
    _n("torch", "Tensor._values", "call", TORCH, "a sparse COO tensor's values"),
    _n("torch.utils._python_dispatch", "is_traceable_wrapper_subclass", "call", TORCH, "a wrapper's inner tensors"),
    _n("torch._C", "_functorch.is_batchedtensor", "call", TORCH, "a vmap level's tensor (no storage of its own)"),
    _n("torch._C", "_functorch.get_unwrapped", "call", TORCH, "the tensor a vmap level's tensor wraps"),
    # IPython: the references it keeps out of sight (nbhw.session reads and clears them)
    _n("IPython.core.displayhook", "DisplayHook.update_user_ns", "source", "9.18.1", "its own _, __, ___"),
    _n("IPython.core.ultratb", "AutoFormattedTB.structured_traceback", "source", "9.18.1", "keeps the last tb"),
    # the standard library: the parser's own tables, for help and for naming the valid words
    _n("argparse", "ArgumentParser()._actions", "read", "3.11", "a subcommand's options, listed in error messages"),
    _n("argparse", "ArgumentParser()._subparsers", "read", "3.11", "the subcommands, for their parsers"),
    _n("argparse", "ArgumentParser()._positionals._group_actions", "read", "3.11", "the subparsers action of a parser"),
    # the notebook stack (ui/)
    _n("plotly.graph_objects", "FigureWidget._esm", "read", "7.1.0", "the widget's JS, carried as a string"),
    _n("plotly.graph_objects", "FigureWidget()._data", "read", "7.1.0", "a stopped graph's traces, into its state"),
    _n("plotly.graph_objects", "FigureWidget()._layout_obj._props", "read", "7.1.0", "a stopped graph's layout"),
    _n("plotly.graph_objects", "FigureWidget()._widget_data", "patch", "7.1.0", "the traces a saved notebook keeps"),
    _n("plotly.graph_objects", "FigureWidget()._widget_layout", "patch", "7.1.0", "the layout a saved notebook keeps"),
    _n("ipywidgets", "Widget._handle_msg", "patch", "8.1.9", "browser messages handled under nbhw's widget lock"),
    _n("traitlets", "HasTraits()._trait_values", "read", "5.14", "a widget's children without creating defaults"),
)


def installed_version(library: str) -> str | None:
    """The installed version of a library's distribution (as importlib.metadata finds it first), None if none."""
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return None


def in_installed_version(name: PrivateName) -> bool:
    """Whether the installed release of the name's library is one the name exists in (``versions``).

    True for a name of every version; False when the library is not installed or its version is not in the range.
    """
    if not name.versions:
        return True
    version = installed_version(name.library)
    if version is None:
        return False
    try:
        return SpecifierSet(name.versions).contains(version, prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return False


def resolve(name: PrivateName) -> Any:
    """The object a name stands for in the installed library; AttributeError / ImportError when it is gone.

    A name nbhw reads as source (``how="source"``) is found in the library's file, without running it: some are
    defined only when an optional package is installed.
    """
    if name.how == "source":
        return _source(name)
    found: Any = importlib.import_module(name.module)
    for part in name.attribute.split("."):
        found = _attribute(found, part)
    return found


def module_file(module: str) -> Path | None:
    """The source file of a module, found without importing it or its package (importing may be the harm)."""
    top, _, rest = module.partition(".")
    relative = rest.replace(".", "/")
    for candidate in (f"{relative}.py", f"{relative}/__init__.py") if rest else ("__init__.py",):
        found = library_file(top, candidate)
        if found is not None:
            return found
    return None


def _source(name: PrivateName) -> str:
    path = module_file(name.module)
    if path is None:
        raise ImportError(f"no module {name.module}")
    found = function_source(path, name.attribute)
    if found is None:  # a module-level name nbhw reads with ast: its assignment at the start of a line
        m = re.search(rf"^{re.escape(name.attribute)}\s*[:=].*$", path.read_text(encoding="utf-8"), re.MULTILINE)
        found = m.group(0) if m else None
    if found is None:
        raise AttributeError(f"{name.module} defines no {name.attribute}")
    return found


def _attribute(owner: Any, part: str) -> Any:
    # "Class()" stands for an instance (attributes __init__ sets); class flags may be annotations without a value.
    call = re.fullmatch(r"(\w+)\((.*)\)", part)
    if call is not None:
        args, kwargs = _literal_arguments(call.group(2))
        return getattr(owner, call.group(1))(*args, **kwargs)
    if hasattr(owner, part):
        return getattr(owner, part)
    if part in getattr(owner, "__annotations__", {}):
        return owner.__annotations__[part]
    raise AttributeError(f"{owner!r} has no attribute {part!r}")


def _literal_arguments(text: str) -> tuple[list[Any], dict[str, Any]]:
    """The literal arguments written in a ``Class(...)`` part: ("'org/name', version=1") -> (["org/name"], {...})."""
    if not text.strip():
        return [], {}
    call = ast.parse(f"f({text})", mode="eval").body
    assert isinstance(call, ast.Call)
    args = [ast.literal_eval(a) for a in call.args]
    kwargs = {str(k.arg): ast.literal_eval(k.value) for k in call.keywords}
    return args, kwargs
