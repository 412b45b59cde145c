"""Memory estimate from a model built on the meta device: exact weights, largest layer, training, and the run.

Weights come from the libraries: transformers' ``compute_module_sizes`` (tied weights once, quantized weights at the
quantizer's element size), accelerate's ``get_max_layer_size`` and ``estimate_training_usage``. What generating at
``batch x context`` adds (the cache, the fixed state, the prefill's transients, the framework's reserve, the host's
peak while loading) comes from one source only, the dry run of :mod:`nbhw.core.plan.run`; the plan fills it in
(:meth:`Estimate.with_run`), and where the dry run can't answer ``run_problem`` says which part and why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from nbhw.core.hf.module_sizes import module_sizes
from nbhw.core.plan.outside_tensors import LoadPeak
from nbhw.core.plan.run_figures import RunEstimate


@dataclass
class Estimate:
    """What the weights and training take in the plan's dtype, and what the run at ``batch x context`` holds.

    The run's fields are None until the plan's dry run has filled them in (``plan.estimate`` always has; the
    Load tab shows the weights first), and stay None when the dry run can't answer (``run_problem`` says why).
    """

    dtype: str
    parameters: int
    embedding_parameters: int
    parameter_bytes: int
    buffer_bytes: int
    largest_layer_bytes: int
    largest_layer: list[str]
    training: dict[str, int] = field(default_factory=dict)
    training_precision: str = "bfloat16"
    quantization: str | None = None
    notes: list[str] = field(default_factory=list)
    # the run (nbhw.core.plan.run): tokens per sequence, sequences, and what the dry run measured
    context: int | None = None
    batch: int | None = None
    encoder_length: int | None = None
    cache_bytes: int | None = None  # right after the prefill: the peak of the cache (a window still holds the prompt)
    cache_decode_bytes: int | None = None  # after the decode step that reaches the context
    state_bytes: int | None = None  # of cache_bytes: fixed conv / recurrent state of state-space and hybrid layers
    cross_cache_bytes: int | None = None  # of cache_bytes: cross-attention keys and values (encoder-decoder)
    activation_bytes: int | None = None  # the prefill's transient peak above weights and cache
    peak_bytes: int | None = None  # the run's tensors at their worst moment, every device together
    reserve_bytes: int | None = None  # what the frameworks hold outside tensors, every device the run uses
    load_peak: LoadPeak | None = None  # the host while from_pretrained reads the checkpoint
    cache_class: str | None = None
    not_covered: list[str] = field(default_factory=list)  # what the dry run does not see, in words
    run_problem: str | None = None  # why there are no run figures
    cache_at: Callable[[int], int | None] | None = field(default=None, repr=False, compare=False)

    @property
    def total_bytes(self) -> int:
        """Parameters and buffers: what the loaded model holds."""
        return self.parameter_bytes + self.buffer_bytes

    @property
    def non_embedding_parameters(self) -> int:
        """Parameters outside the input embedding (the figure model cards quote as 'non-embedding')."""
        return self.parameters - self.embedding_parameters

    @property
    def training_peak(self) -> int:
        """accelerate's 'Training using Adam' figure: the largest of its stages (batch size 1, no activations)."""
        return max(self.training.values(), default=0)

    @property
    def training_total(self) -> int:
        """accelerate's weights + gradients + optimizer states, held together as they are during a step."""
        return sum(v for k, v in self.training.items() if k in {"model", "gradients", "optimizer"})

    @property
    def load_peak_bytes(self) -> int | None:
        """The host's resident memory at the load's peak (private copies plus the checkpoint's mapped pages)."""
        return None if self.load_peak is None else self.load_peak.rss_bytes

    def kv_cache_bytes(self, tokens: int = 1000) -> int | None:
        """The cache of one sequence of ``tokens`` tokens, by a dry run at that length; None when not covered."""
        return self.cache_at(tokens) if self.cache_at is not None else None

    @property
    def kv_cache_per_1k_tokens(self) -> int | None:
        """The cache of one sequence of 1,000 tokens (a dry run at that length)."""
        return self.kv_cache_bytes(1000)

    def with_run(self, run: RunEstimate, *, weight_bytes: int, reserve_bytes: int, **extra: Any) -> Estimate:
        """This estimate with a dry run's figures; ``weight_bytes``: the weights as placed (quantized size)."""
        return replace(
            self,
            context=run.context,
            batch=run.batch,
            encoder_length=run.encoder_tokens,
            cache_bytes=run.cache_bytes,
            cache_decode_bytes=run.cache_decode_bytes,
            state_bytes=run.state_bytes,
            cross_cache_bytes=run.cross_cache_bytes,
            activation_bytes=run.activation_bytes,
            peak_bytes=run.peak_bytes - run.weight_bytes + weight_bytes,
            reserve_bytes=reserve_bytes,
            cache_class=run.cache_class,
            not_covered=list(run.not_covered),
            **extra,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (bytes as ints)."""
        return {
            "dtype": self.dtype,
            "quantization": self.quantization,
            "parameters": self.parameters,
            "non_embedding_parameters": self.non_embedding_parameters,
            "parameter_bytes": self.parameter_bytes,
            "buffer_bytes": self.buffer_bytes,
            "total_bytes": self.total_bytes,
            "largest_layer_bytes": self.largest_layer_bytes,
            "largest_layer": self.largest_layer,
            "training": dict(self.training),
            "training_peak": self.training_peak,
            "training_total": self.training_total,
            "training_precision": self.training_precision,
            "context": self.context,
            "batch": self.batch,
            "encoder_length": self.encoder_length,
            "cache_bytes": self.cache_bytes,
            "cache_decode_bytes": self.cache_decode_bytes,
            "state_bytes": self.state_bytes,
            "cross_cache_bytes": self.cross_cache_bytes,
            "activation_bytes": self.activation_bytes,
            "peak_bytes": self.peak_bytes,
            "reserve_bytes": self.reserve_bytes,
            "load_peak_bytes": self.load_peak_bytes,
            "load_peak": None if self.load_peak is None else vars(self.load_peak),
            "cache_class": self.cache_class,
            "not_covered": list(self.not_covered),
            "run_problem": self.run_problem,
            "notes": list(self.notes),
        }


def training_usage(parameters: int, dtype: str) -> tuple[dict[str, int], str]:
    """accelerate's Adam estimate for full fine-tuning in mixed precision, from the float32 size of the weights."""
    # lazy: import nbhw and %load_ext nbhw stay free of accelerate
    from accelerate.commands.estimate import estimate_training_usage

    precision = "float16" if dtype == "float16" else "bfloat16"
    usage = estimate_training_usage(parameters * 4, precision)
    return {k: int(v) for k, v in usage.items()}, precision


def _embedding_parameters(model: Any) -> int:
    try:
        embeddings = model.get_input_embeddings()
    except (NotImplementedError, AttributeError):
        return 0
    return sum(p.numel() for p in embeddings.parameters()) if embeddings is not None else 0


def estimate(model: Any, dtype: str, *, quantizer: Any = None, quantization: str | None = None) -> Estimate:
    """The estimate for a meta-device ``model`` built in ``dtype`` (``quantizer``: transformers' sizes per weight)."""
    # lazy: import nbhw and %load_ext nbhw stay free of accelerate
    from accelerate.utils.modeling import get_max_layer_size

    sizes, _ = module_sizes(model, quantizer)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    parameters = sum(p.numel() for p in model.parameters())
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    top = list(model.named_parameters(recurse=False)) + list(model.named_children())
    top += list(model.named_buffers(recurse=False))
    largest, names = get_max_layer_size(top, sizes, no_split)
    training, precision = training_usage(parameters, dtype)
    return Estimate(
        dtype=dtype,
        parameters=parameters,
        embedding_parameters=_embedding_parameters(model),
        parameter_bytes=int(sizes[""]) - buffers,
        buffer_bytes=buffers,
        largest_layer_bytes=int(largest),
        largest_layer=list(names),
        training=training,
        training_precision=precision,
        quantization=quantization,
    )
