"""The training cell, the script, the accelerate / DeepSpeed config files and the launch command for a plan.

The launch uses the libraries' own engines: ``Trainer`` runs the step, ``torchrun`` / ``accelerate launch`` start the
processes, FSDP2 and DeepSpeed are configured through ``TrainingArguments(fsdp=..., fsdp_config=...)`` and
``TrainingArguments(deepspeed=...)`` (so one script runs under either launcher), tensor parallelism through
``from_pretrained(tp_plan="auto")``. Every piece of source is checked with ``ast`` before it is returned.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbhw.core.hf.library_source import function_source, library_file
from nbhw.core.render import py_str
from nbhw.core.train.arguments import TrainArgs
from nbhw.core.train.training_build import DOUBLE_QUANT, QUANT_TYPE

SCRIPT_NAME = "train_nbhw.py"
ACCELERATE_CONFIG_NAME = "accelerate_config.yaml"
DEEPSPEED_CONFIG_NAME = "ds_config.json"
PLACEHOLDER_ROWS = 16
ZERO = ("zero2", "zero3")


def _several(args: TrainArgs) -> bool:
    return args.world_size > 1


@functools.cache
def accelerate_fsdp_types() -> tuple[str, ...] | None:
    """The distributed types accelerate turns into FSDP, read from ``AcceleratorState.__init__`` (the
    ``self.distributed_type in [...]`` branch that sets ``DistributedType.FSDP``); None: not found there.

    accelerate 1.16 lists the multi-accelerator types only (MULTI_GPU, MULTI_XPU, ...): on CPU processes
    (MULTI_CPU) ``Trainer(fsdp=...)`` and ``accelerate launch`` with an FSDP config train plain DDP, silently.
    """
    path = library_file("accelerate", "state.py")
    source = function_source(path, "AcceleratorState.__init__") if path is not None else None
    if source is None:
        return None
    for node in ast.walk(ast.parse(source)):
        if _sets_fsdp(node):
            return tuple(ast.unparse(e).rpartition(".")[2] for e in node.test.comparators[0].elts)  # type: ignore[attr-defined]
    return None


def _sets_fsdp(node: ast.AST) -> bool:
    if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)):
        return False
    listed = node.test.comparators[0]
    return (
        ast.unparse(node.test.left) == "self.distributed_type"
        and isinstance(node.test.ops[0], ast.In)
        and isinstance(listed, ast.List | ast.Tuple)
        and "DistributedType.FSDP" in ast.unparse(ast.Module(node.body, []))
    )


def shards_at_load(device_type: str) -> bool:
    """FSDP2 on ``device_type`` through transformers' own sharding at load (``DistributedConfig(fsdp_size=N)``,
    which Trainer leaves unwrapped) instead of accelerate's: where accelerate would not turn the processes into
    FSDP (CPU devices)."""
    return device_type == "cpu" and "MULTI_CPU" not in (accelerate_fsdp_types() or ())


def fsdp2_at_load(args: TrainArgs) -> bool:
    """This plan's FSDP2 shards at load (see :func:`shards_at_load`)."""
    return args.strategy == "fsdp2" and shards_at_load(args.device_type)


def fsdp2_at_load_note(args: TrainArgs) -> str:
    """Why the script shards at load, in accelerate's and transformers' words."""
    from importlib.metadata import version

    listed = accelerate_fsdp_types()
    which = ", ".join(listed) if listed else "no type nbhw could read"
    return (
        f"FSDP2 on CPU processes: accelerate {version('accelerate')} turns FSDP on only for {which} (not MULTI_CPU), "
        "so Trainer(fsdp=...) and `accelerate launch` with an FSDP config would train plain DDP here; the script "
        f"shards at load with transformers' own FSDP2 (DistributedConfig(fsdp_size={args.world_size})), which "
        "Trainer leaves unwrapped, and torchrun starts it"
    )


# --------------------------------------------------------------------------------------------- TrainingArguments


def training_argument_names() -> set[str]:
    from transformers import TrainingArguments

    return {f.name for f in dataclasses.fields(TrainingArguments)}


def checkpointing_keyword() -> str:
    """transformers 5.24 renamed gradient_checkpointing to activation_checkpointing (the old name is a deprecated
    alias); write the name this transformers documents."""
    names = training_argument_names()
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def fsdp_config(args: TrainArgs) -> dict[str, Any]:
    """TrainingArguments.fsdp_config for FSDP2 full shard (keys as transformers 5.24 documents them)."""
    return {
        "version": 2,
        "reshard_after_forward": True,
        "cpu_offload": args.offload,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    }


def deepspeed_config(args: TrainArgs) -> dict[str, Any]:
    """A DeepSpeed config for ZeRO-2/3; "auto" values are filled in by transformers from TrainingArguments."""
    stage = 2 if args.strategy == "zero2" else 3
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True}
    if args.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": zero,
    }
    precision = _precision_flag(args)
    if precision == "bf16":
        config["bf16"] = {"enabled": "auto"}
    elif precision == "fp16":
        config["fp16"] = {"enabled": "auto"}
    return config


def _precision_flag(args: TrainArgs) -> str | None:
    if args.device_type == "cpu":
        return None
    if args.mixed_precision is not None:
        return args.mixed_precision
    if args.dtype == "float32":
        return None
    return "bf16" if args.dtype == "bfloat16" else "fp16"


def training_arguments(args: TrainArgs) -> list[tuple[str, str]]:
    """The TrainingArguments keywords the cell writes, as source."""
    kwargs: list[tuple[str, str]] = [
        ("output_dir", py_str("nbhw-train-output")),
        ("per_device_train_batch_size", str(args.batch)),
        ("gradient_accumulation_steps", str(args.gradient_accumulation_steps)),
    ]
    if args.gradient_checkpointing:
        kwargs.append((checkpointing_keyword(), "True"))
    kwargs.append(("optim", py_str(args.optimizer)))
    precision = _precision_flag(args)
    if precision is not None:
        kwargs.append((precision, "True"))
    kwargs += [
        ("learning_rate", "2e-5" if args.method == "full" else "2e-4"),
        ("num_train_epochs", "1"),
        ("logging_steps", "1"),
        ("save_strategy", py_str("no")),
        ("report_to", py_str("none")),
    ]
    if args.device_type == "cpu":
        kwargs.append(("use_cpu", "True"))
        if _several(args):
            kwargs.append(("ddp_backend", py_str("gloo")))
    if args.strategy == "fsdp2" and not fsdp2_at_load(args):
        kwargs += [("fsdp", "True"), ("fsdp_config", _literal(fsdp_config(args)))]
    if args.strategy in ZERO:
        kwargs.append(("deepspeed", py_str(DEEPSPEED_CONFIG_NAME)))
    return kwargs


def _literal(value: Any) -> str:
    return repr(value)


# --------------------------------------------------------------------------------------------- the cell


def _call(target: str, func: str, parts: list[str], indent: str = "") -> str:
    one = f"{indent}{target} = {func}({', '.join(parts)})"
    if len(one) <= 88:
        return one
    body = "".join(f"{indent}    {p},\n" for p in parts)
    return f"{indent}{target} = {func}(\n{body}{indent})"


def _load_lines(model_id: str, args: TrainArgs) -> list[str]:
    parts = ["model_id", f"dtype=torch.{args.dtype}"]
    if args.method == "qlora":
        parts.append(
            "quantization_config=BitsAndBytesConfig(\n"
            "        load_in_4bit=True,\n"
            f"        bnb_4bit_quant_type={py_str(QUANT_TYPE)},\n"
            f"        bnb_4bit_compute_dtype=torch.{args.dtype},\n"
            f"        bnb_4bit_use_double_quant={DOUBLE_QUANT},\n"
            "    )"
        )
    if args.strategy == "tp":
        # transformers 5.24 takes the plan in DistributedConfig (a bare tp_plan= is deprecated); the TP size
        # defaults to WORLD_SIZE: one process per device (torchrun), and no device_map.
        parts.append('distributed_config=DistributedConfig(tp_plan="auto")')
    elif fsdp2_at_load(args):
        offload = ", fsdp_cpu_offload=True" if args.offload else ""
        parts.append(f"distributed_config=DistributedConfig(fsdp_size={args.world_size}{offload})")
    elif args.method == "qlora" and args.device_type == "cpu":
        parts.append('device_map="cpu"')
    elif args.method == "qlora" and _several(args):
        # Each process loads its 4-bit copy onto its own device.
        parts.append('device_map={"": PartialState().local_process_index}')
    lines = [
        f"model_id = {py_str(model_id)}",
        "tokenizer = AutoTokenizer.from_pretrained(model_id)",
        "tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token",
        _call("model", "AutoModelForCausalLM.from_pretrained", parts),
    ]
    if args.method == "qlora":
        gc = args.gradient_checkpointing
        lines.append(f"model = prepare_model_for_kbit_training(model, use_gradient_checkpointing={gc})")
    if args.method in ("lora", "qlora"):
        targets = args.lora_target_modules
        target_src = repr(list(targets)) if isinstance(targets, tuple) else repr(targets)
        lora = [f"r={args.lora_r}", f"lora_alpha={args.alpha}", "lora_dropout=0.0"]
        if targets is not None:
            lora.append(f"target_modules={target_src}")
        lora.append('task_type="CAUSAL_LM"')
        lines += [
            _call("lora_config", "LoraConfig", lora),
            "model = get_peft_model(model, lora_config)",
            "model.print_trainable_parameters()",
        ]
    return lines


def _data_lines(args: TrainArgs) -> list[str]:
    return [
        "",
        f"# Placeholder data: {PLACEHOLDER_ROWS} rows of {args.context} tokens. Replace `text` with your corpus (or",
        "# train_dataset with your own tokenized dataset); rows of equal length need no padding.",
        f"context = {args.context}",
        'text = "Replace this placeholder with your own training text. "',
        'ids = tokenizer(text)["input_ids"]',
        f"ids = (ids * (context * {PLACEHOLDER_ROWS} // len(ids) + 1))[: context * {PLACEHOLDER_ROWS}]",
        'train_dataset = [{"input_ids": ids[i : i + context]} for i in range(0, len(ids), context)]',
        "data_collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)",
    ]


def _trainer_lines(args: TrainArgs) -> list[str]:
    return [
        "",
        _call("training_args", "TrainingArguments", [f"{k}={v}" for k, v in training_arguments(args)]),
        "trainer = Trainer(",
        "    model=model,",
        "    args=training_args,",
        "    train_dataset=train_dataset,",
        "    data_collator=data_collator,",
        ")",
        "trainer.train()",
    ]


def _imports(args: TrainArgs) -> list[str]:
    names = ["AutoModelForCausalLM", "AutoTokenizer", "DataCollatorForLanguageModeling", "Trainer", "TrainingArguments"]
    if args.method == "qlora":
        names.append("BitsAndBytesConfig")
    if args.strategy == "tp" or fsdp2_at_load(args):
        names.append("DistributedConfig")
    lines = ["import torch", f"from transformers import {', '.join(sorted(names))}"]
    several = _several(args) and args.device_type != "cpu"
    if args.method == "qlora" and several:
        lines.insert(0, "from accelerate import PartialState")
    if args.method == "lora":
        lines.append("from peft import LoraConfig, get_peft_model")
    elif args.method == "qlora":
        lines.append("from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training")
    return lines


def training_cell(model_id: str, args: TrainArgs) -> str:
    """The notebook cell (or script body): load, (Q)LoRA, placeholder data, TrainingArguments, Trainer."""
    lines = [
        *_imports(args),
        "",
        *_load_lines(model_id, args),
        *_data_lines(args),
        *_trainer_lines(args),
    ]
    source = "\n".join(lines) + "\n"
    ast.parse(source)
    return source


def training_script(model_id: str, args: TrainArgs) -> str:
    """The script each process runs: the cell's body in main(), so notebook_launcher can start it too."""
    cell = training_cell(model_id, args)
    imports, _, body = cell.partition("\n\n")
    indented = "\n".join(("    " + line) if line else "" for line in body.rstrip("\n").split("\n"))
    source = (
        f'"""Written by nbhw: {args.strategy} on {args.nodes} x {args.devices} device(s)."""\n'
        f'{imports}\n\n\ndef main() -> None:\n{indented}\n\n\nif __name__ == "__main__":\n    main()\n'
    )
    ast.parse(source)
    return source


# --------------------------------------------------------------------------------------------- files and commands


def accelerate_config(args: TrainArgs) -> dict[str, Any]:
    """The accelerate config for ``accelerate launch``: topology, precision and the FSDP2 / DeepSpeed section.

    The script's TrainingArguments carry the same FSDP / DeepSpeed settings, so ``torchrun`` runs it unchanged.
    Several CPU processes are written as MULTI_GPU with ``use_cpu: true``: ``accelerate launch`` starts processes
    through torchrun only for the multi-accelerator types (``_validate_launch_command`` / ``launch_command``);
    MULTI_CPU starts one process unless MPI is set up. Each process then runs on the CPU (``use_cpu``, and the
    script's ``TrainingArguments(use_cpu=True)``), where accelerate makes it MULTI_CPU.
    """
    precision = _precision_flag(args) or "no"
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "num_machines": args.nodes,
        "num_processes": args.world_size,
        "machine_rank": 0,
        "mixed_precision": precision,
        "use_cpu": args.device_type == "cpu",
        "main_training_function": "main",
    }
    if args.nodes > 1:
        config.update(
            {
                "main_process_ip": "MAIN_NODE_IP",
                "main_process_port": 29500,
                "same_network": True,
                "rdzv_backend": "static",
            }
        )
    if fsdp2_at_load(args):
        config["distributed_type"] = "MULTI_GPU"  # processes only (see accelerate_config); the script shards at load
    elif args.strategy == "fsdp2":
        config["distributed_type"] = "FSDP"
        config["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": True,
            "fsdp_offload_params": args.offload,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_state_dict_type": "FULL_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": False,
        }
    elif args.strategy in ZERO:
        config["distributed_type"] = "DEEPSPEED"
        config["deepspeed_config"] = {
            "deepspeed_config_file": DEEPSPEED_CONFIG_NAME,
            "deepspeed_multinode_launcher": "standard",
        }
        # accelerate refuses mixed_precision beside a DeepSpeed config file: the file holds it.
        config.pop("mixed_precision")
    elif _several(args):
        config["distributed_type"] = "MULTI_GPU"  # with use_cpu on CPU devices: see accelerate_config
    else:
        config["distributed_type"] = "NO"
    return config


def _yaml(config: dict[str, Any]) -> str:
    import yaml

    return str(yaml.safe_dump(config, sort_keys=False))


def torchrun_command(args: TrainArgs, script: str = SCRIPT_NAME) -> str:
    """The exact torchrun line (run on every node; node_rank and the main node's address differ per node)."""
    if args.nodes == 1:
        return f"torchrun --nnodes 1 --nproc_per_node {args.devices} {script}"
    return (
        f"torchrun --nnodes {args.nodes} --nproc_per_node {args.devices} --node_rank $NODE_RANK "
        f"--master_addr $MAIN_NODE_IP --master_port 29500 {script}"
    )


def accelerate_command(args: TrainArgs, script: str = SCRIPT_NAME) -> str:
    if args.nodes == 1:
        return f"accelerate launch --config_file {ACCELERATE_CONFIG_NAME} {script}"
    return (
        f"accelerate launch --config_file {ACCELERATE_CONFIG_NAME} --machine_rank $NODE_RANK "
        f"--main_process_ip $MAIN_NODE_IP {script}"
    )


def notebook_launcher_cell(args: TrainArgs, script: str = SCRIPT_NAME) -> str | None:
    """Starting the script's main() from a notebook, where accelerate's notebook_launcher can (one node, DDP)."""
    if args.nodes > 1 or args.strategy not in ("ddp",):
        return None
    module = script.removesuffix(".py")
    source = (
        f"from accelerate import notebook_launcher\nfrom {module} import main\n\n"
        f"notebook_launcher(main, num_processes={args.devices})\n"
    )
    ast.parse(source)
    return source


@dataclass
class LaunchFiles:
    """What to write and what to type."""

    script: str
    accelerate_config: str
    deepspeed_config: str | None
    command: str  # the recommended command
    commands: dict[str, str] = field(default_factory=dict)  # every launcher that runs this plan
    notebook_launcher: str | None = None
    notes: list[str] = field(default_factory=list)

    def write(self, folder: str | Path) -> list[Path]:
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        written = [out / SCRIPT_NAME, out / ACCELERATE_CONFIG_NAME]
        written[0].write_text(self.script)
        written[1].write_text(self.accelerate_config)
        if self.deepspeed_config is not None:
            written.append(out / DEEPSPEED_CONFIG_NAME)
            written[-1].write_text(self.deepspeed_config)
        return written


def launch_files(model_id: str, args: TrainArgs) -> LaunchFiles:
    script = training_script(model_id, args)
    ds = deepspeed_config(args) if args.strategy in ZERO else None
    commands = {"torchrun": torchrun_command(args), "accelerate": accelerate_command(args)}
    notes: list[str] = []
    if args.strategy == "tp":
        command = commands["torchrun"]
        notes.append("tp_plan='auto' needs one process per device (torchrun) and no device_map")
    elif fsdp2_at_load(args):
        command = commands["torchrun"]
        notes.append(fsdp2_at_load_note(args))
    elif args.strategy in ("fsdp2", "zero2", "zero3"):
        command = commands["accelerate"]
    elif args.strategy == "single":
        command = f"python {SCRIPT_NAME}"
        commands = {"python": command}
    else:
        command = commands["torchrun"]
    return LaunchFiles(
        script=script,
        accelerate_config=_yaml(accelerate_config(args)),
        deepspeed_config=None if ds is None else json.dumps(ds, indent=2) + "\n",
        command=command,
        commands=commands,
        notebook_launcher=notebook_launcher_cell(args),
        notes=notes,
    )
