"""Build a model on the meta device through transformers' own __init__ validation: no weights, no downloads.

``from_config`` under ``torch.device("meta")`` runs the same attention / dtype / kernel checks ``from_pretrained``
runs, so the error it raises is the error the user would get. Before building, :func:`needs_download` says whether
transformers would fetch a Hub kernel for this ``attn_implementation`` (it does so even on a meta build); callers
then report "needs download, not checked" instead of building. As a second guard the build runs with the Hub set
offline, so a download nbhw failed to foresee fails fast instead of happening.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Auto classes in the order nbhw prefers them when an architecture appears in several mappings.
AUTO_CLASSES = (
    ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("AutoModelForImageTextToText", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
    ("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("AutoModelForSpeechSeq2Seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    ("AutoModelForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
    ("AutoModelForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"),
    ("AutoModelForImageClassification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ("AutoModelForCTC", "MODEL_FOR_CTC_MAPPING_NAMES"),
)
GENERATIVE = {
    "AutoModelForCausalLM",
    "AutoModelForImageTextToText",
    "AutoModelForSeq2SeqLM",
    "AutoModelForSpeechSeq2Seq",
}


def auto_class_name(config: Any) -> str:
    """The Auto class a user would load this config with: by its architecture, else by model type; AutoModel last."""
    from transformers.models.auto import modeling_auto  # lazy: import nbhw and %load_ext nbhw stay free of transformers

    archs = list(getattr(config, "architectures", None) or [])
    model_type = getattr(config, "model_type", None)
    for name, mapping_name in AUTO_CLASSES:
        mapping = getattr(modeling_auto, mapping_name, {})
        if any(arch in set(mapping.values()) for arch in archs):
            return name
    for name, mapping_name in AUTO_CLASSES:
        if model_type in getattr(modeling_auto, mapping_name, {}):
            return name
    return "AutoModel"


def model_class(config: Any, auto_name: str | None = None) -> Any:
    """The concrete model class (e.g. Qwen3ForCausalLM) the Auto class maps this config to."""
    import transformers  # lazy: import nbhw and %load_ext nbhw stay free of transformers

    auto = getattr(transformers, auto_name or auto_class_name(config))
    return auto._model_mapping[type(config)]


def kernels_status() -> tuple[bool, str]:
    """Whether transformers can use Hub kernels here, and a one-line why (version range from transformers)."""
    from transformers.utils import import_utils  # lazy: import nbhw and %load_ext nbhw stay free of transformers

    low, high = import_utils.KERNELS_MIN_VERSION, import_utils.KERNELS_MAX_VERSION
    if importlib.util.find_spec("kernels") is None:
        return False, f"the kernels package is not installed (transformers accepts kernels>={low},<{high})"
    if not import_utils.is_kernels_available():
        from importlib.metadata import version as installed  # lazy: 20 ms, and %load_ext's budget is 30 ms

        version = installed("kernels")
        return False, f"kernels {version} is installed, but this transformers needs kernels>={low},<{high}"
    return True, f"kernels is installed and within transformers' range >={low},<{high}"


def is_hub_kernel(attn_implementation: str | None) -> bool:
    """Whether the value names a Hub kernel repo ("org/repo[@rev][:func]"), by transformers' own rule."""
    from transformers.integrations import hub_kernels  # lazy: import nbhw and %load_ext nbhw stay free of transformers

    return bool(hub_kernels.is_kernel(attn_implementation))


def flash_package_installed(version: int) -> bool:
    """Whether the flash-attention package for FA2/3/4 is installed, by transformers' compatibility matrix."""
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.modeling_flash_attention_utils import FLASH_ATTENTION_COMPATIBILITY_MATRIX

    entry = FLASH_ATTENTION_COMPATIBILITY_MATRIX.get(version)
    return bool(entry and entry["pkg_availability_check"]())


def needs_download(attn_implementation: str | None) -> bool:
    """Whether building with this attn_implementation would make transformers download a Hub kernel."""
    if attn_implementation is None:
        return False
    impl = attn_implementation.split("|")[-1]
    kernels_ok = kernels_status()[0]
    if is_hub_kernel(impl):
        return kernels_ok
    if impl.startswith("flash_attention_") and impl[-1].isdigit():
        return kernels_ok and not flash_package_installed(int(impl[-1]))
    return False


# forced_offline() and quiet() save and restore process-wide settings: two threads interleaving them (the panel's
# worker and a cell) could leave the Hub offline or warnings off for good, so they take turns.
_settings_lock = threading.RLock()


@contextlib.contextmanager
def forced_offline() -> Iterator[None]:
    """Make huggingface_hub refuse the network for the duration (the second guard against downloads)."""
    from huggingface_hub import constants

    with _settings_lock:
        old = constants.HF_HUB_OFFLINE
        constants.HF_HUB_OFFLINE = True
        try:
            yield
        finally:
            constants.HF_HUB_OFFLINE = old


# Besides transformers' own: accelerate, and what importing transformers' quantizers imports (torchao logs every
# prebuilt kernel it can't load for this Python; torch warns about the enums torchao registers).
QUIET_LOGGERS = ("accelerate", "torchao", "torch.utils._pytree")


class _Depth(threading.local):
    value = 0


_quiet_depth = _Depth()


@contextlib.contextmanager
def _deeper() -> Iterator[None]:
    _quiet_depth.value += 1
    try:
        yield
    finally:
        _quiet_depth.value -= 1


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence transformers' and accelerate's logging, warnings and progress bars; problems come back as values.

    A hypothetical GPU is not a warning worth printing while planning, and a log line from the panel's worker would
    land in whichever cell runs.
    """
    from transformers.utils import logging as hf_logging  # transformers: only once something is planned

    with _settings_lock:
        if _quiet_depth.value:  # already quiet in this thread: nothing to set again
            with _deeper():
                yield
            return
        # transformers' root logger (its get_logger() without a name) and the others, back to their own levels after.
        loggers = [hf_logging.get_logger(), *(logging.getLogger(name) for name in QUIET_LOGGERS)]
        bars, levels = hf_logging.is_progress_bar_enabled(), [lg.level for lg in loggers]
        _set_levels(loggers, [logging.ERROR] * len(loggers))
        # In a kernel a progress bar is a set of widgets nobody closes, shown in whichever cell runs.
        hf_logging.disable_progress_bar()
        try:
            with warnings.catch_warnings(), _deeper():
                warnings.simplefilter("ignore")
                yield
        finally:
            _set_levels(loggers, levels)
            if bars:
                hf_logging.enable_progress_bar()


def _set_levels(loggers: list[logging.Logger], levels: list[int]) -> None:
    """Each logger's level, with one clear of logging's level caches for them all: Logger.setLevel() clears the
    cache of every logger there is (transformers makes one per module), so only the last one is set through it."""
    for lg, level in zip(loggers[:-1], levels[:-1], strict=True):
        lg.level = level
    loggers[-1].setLevel(levels[-1])


@dataclass
class MetaBuild:
    """The outcome of a meta-device build: the model, or the exception transformers raised."""

    model: Any | None
    error: str | None = None
    error_type: str | None = None

    @property
    def ok(self) -> bool:
        """Whether transformers accepted the combination."""
        return self.error is None


def _dtype(dtype: Any) -> Any:
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    if dtype is None or dtype == "auto" or not isinstance(dtype, str):
        return dtype
    return getattr(torch, dtype)


def build(
    config: Any, *, dtype: Any = None, attn_implementation: Any = None, auto_name: str | None = None
) -> MetaBuild:
    """Instantiate ``config`` on the meta device with these options; never downloads, never raises."""
    import copy

    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch
    import transformers  # lazy: import nbhw and %load_ext nbhw stay free of transformers

    auto = getattr(transformers, auto_name or auto_class_name(config))
    kwargs: dict[str, Any] = {}
    if dtype is not None:
        kwargs["dtype"] = _dtype(dtype)
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    try:
        with quiet(), forced_offline(), torch.device("meta"):
            model = auto.from_config(copy.deepcopy(config), **kwargs)
    except Exception as exc:
        return MetaBuild(None, " ".join(str(exc).split()), type(exc).__name__)
    return MetaBuild(model)


def before_dtype_plan(model: Any) -> Any:
    """``model``'s class and config built again on meta in its dtype, as ``from_pretrained`` holds it before applying
    its dtype plan (the modules kept in float32 are still in the load dtype): the model transformers sizes for
    device_map="auto". ``model`` itself when that plan is empty."""
    import copy

    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    dtype = getattr(model.config, "dtype", None)
    if not isinstance(dtype, torch.dtype) or not model._get_dtype_plan(dtype):
        return model
    with quiet(), forced_offline(), torch.device("meta"):  # the config keeps the attention that was accepted
        return type(model)._from_config(copy.deepcopy(model.config), dtype=dtype)
