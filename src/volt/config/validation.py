"""Checks a composed config before anything is started: each problem becomes one line that names
the key, the bad value, what is allowed and what to type instead."""

import importlib.util
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from volt.checkpointing import is_sharded_checkpoint
from volt.config.lightning_flags import check_trainer_flags
from volt.config.rules import (
    CALLBACK_RULES,
    LOADER_RULES,
    LOGGER_PACKAGES,
    LOGGERS_EXTRA,
    TRAINER_RULES,
    Rule,
    int_from,
    is_int,
    is_number,
    one_of,
    path_part,
)
from volt.errors import ConfigError
from volt.gpu import float8_unavailable

PRECISIONS = ("64-true", "32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true")
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")
COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# Train's and eval's: what a checkpoint's tensors are measured against (volt.checkpointing).
CHECKPOINT_BYTES = Rule(
    "checkpoint_bytes",
    one_of("allocated", "apparent"),
    "allocated or apparent",
    "checkpoint_bytes=apparent",
)

TRAIN_RULES = (
    path_part("task_name", "task_name=train"),
    path_part("name", "name=cifar-baseline"),
    Rule("resume", one_of(None, True, False), "null, true or false", "resume=true"),
    Rule(
        "task.watch",
        lambda v: isinstance(v, str) and v != "",
        "the name of a metric the LightningModule logs",
        "task.watch=val/loss",
    ),
    Rule("task.mode", one_of("max", "min"), "max or min", "task.mode=min"),
    Rule("channels_last", one_of(True, False), "true or false", "channels_last=true"),
    Rule(
        "ema",
        lambda v: v is None or (is_number(v) and 0 < v < 1),
        "null (off) or a decay strictly between 0 and 1",
        "ema=0.999",
    ),
    Rule("ema_warmup", one_of(True, False), "true or false", "ema_warmup=false"),
    Rule(
        "task.module",
        lambda v: v is None or ((isinstance(v, str) and v.isidentifier()) or "." in str(v)),
        "null (the whole LightningModule) or an attribute path of it",
        "task.module=net",
    ),
    Rule(
        "precision", one_of(*PRECISIONS), "one of " + ", ".join(PRECISIONS), "precision=bf16-mixed"
    ),
    Rule("seed", int_from(0, or_null=True), "a non-negative integer or null", "seed=42"),
    Rule("data.batch_size", int_from(1), "a positive integer", "data.batch_size=64"),
    Rule("data.num_workers", int_from(0), "an integer >= 0", "data.num_workers=4"),
    Rule(
        "data.val_fraction",
        lambda v: is_number(v) and 0 < v < 1,
        "a number between 0 and 1",
        "data.val_fraction=0.1",
    ),
    Rule(
        "data.test_fraction",
        lambda v: is_number(v) and 0 < v < 1,
        "a number between 0 and 1",
        "data.test_fraction=0.15",
    ),
    Rule(
        "trainer.accelerator",
        one_of(*ACCELERATORS),
        "one of " + ", ".join(ACCELERATORS),
        "trainer=gpu",
    ),
    Rule(
        "trainer.max_epochs",
        int_from(-1),
        "an integer >= 1 (or -1: no limit)",
        "trainer.max_epochs=20",
    ),
    Rule("trainer.num_nodes", int_from(1), "a positive integer", "trainer.num_nodes=1"),
    Rule(
        "model.optimizer.lr",
        lambda v: is_number(v) and v > 0,
        "a positive number",
        "model.optimizer.lr=1e-3",
    ),
    Rule(
        "compile.mode",
        one_of(*COMPILE_MODES),
        "compile=off|default|reduce-overhead|max-autotune",
        "compile=default",
    ),
    Rule(
        "compile.fullgraph",
        lambda v: isinstance(v, bool),
        "true or false",
        "compile.fullgraph=true",
    ),
    Rule(
        "matmul_precision",
        one_of(None, "highest", "high", "medium"),
        "null (auto), highest, high or medium",
        "matmul_precision=high",
    ),
    Rule("float8", one_of(True, False), "true or false", "float8=true"),
    CHECKPOINT_BYTES,
    Rule("tune", one_of(None, "batch_size", "lr"), "null, batch_size or lr", "tune=lr"),
    Rule("verbose", one_of(True, False), "true or false", "verbose=true"),
    *TRAINER_RULES,
    *LOADER_RULES,
    *CALLBACK_RULES,
)


EVAL_RULES = (
    path_part("task_name", "task_name=eval"),
    path_part("name", "name=baseline-test"),
    Rule(
        "ckpt_path",
        lambda v: (
            Path(str(v)).is_file()
            or (is_sharded_checkpoint(Path(str(v))) and (Path(str(v)) / ".metadata").is_file())
        ),
        "an existing checkpoint file or sharded checkpoint folder",
        "ckpt_path=outputs/train/runs/<run>/checkpoints/last.ckpt",
    ),
    Rule("mode", one_of("test", "predict"), "test or predict", "mode=predict"),
    Rule(
        "precision",
        one_of(None, *PRECISIONS),
        "null (as trained) or one of " + ", ".join(PRECISIONS),
        "precision=32-true",
    ),
    Rule(
        "accelerator", one_of(*ACCELERATORS), "one of " + ", ".join(ACCELERATORS), "accelerator=cpu"
    ),
    Rule("batch_size", int_from(1, or_null=True), "null or a positive integer", "batch_size=256"),
    Rule("max_new_tokens", int_from(1), "a positive integer", "max_new_tokens=4096"),
    CHECKPOINT_BYTES,
)


def _value(cfg: DictConfig, key: str) -> Any:
    try:
        return OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=True)
    except OmegaConfBaseException as error:
        raise ConfigError(f"{key}: {error.msg if hasattr(error, 'msg') else error}") from error


_ABSENT = object()


def _missing_keys(node: DictConfig | ListConfig, prefix: str = "") -> list[str]:
    """Keys set to ???, found without resolving interpolations (some need Hydra's runtime)."""
    keys: list[Any] = list(node.keys()) if isinstance(node, DictConfig) else list(range(len(node)))
    missing = []
    for key in keys:
        name = f"{prefix}.{key}" if prefix else str(key)
        if OmegaConf.is_missing(node, key):
            missing.append(name)
        elif not OmegaConf.is_interpolation(node, key):
            child = node._get_node(key)
            if isinstance(child, DictConfig | ListConfig):
                missing += _missing_keys(child, name)
    return missing


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError for the first bad value. Keys absent from this config are not checked."""
    cfg = OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "hydra"])  # Hydra checks its own
    missing = _missing_keys(cfg)
    if missing:
        raise ConfigError(
            f"{missing[0]} has no value (???): set it on the command line, e.g. {missing[0]}=..."
        )
    # The eval config is the one with a checkpoint to read; task_name only names the directory.
    for rule in EVAL_RULES if "ckpt_path" in cfg else TRAIN_RULES:
        value = _value(cfg, rule.key)
        if value is _ABSENT:
            continue
        if not rule.check(value):
            raise ConfigError(
                f"{rule.key}={value!r} is not valid: use {rule.allowed} (e.g. {rule.example})"
            )
    tune, strategy = cfg.get("tune"), OmegaConf.select(cfg, "trainer.strategy")
    if tune and strategy != "auto":
        raise ConfigError(
            f"tune={tune} runs on one device only (Lightning's finders): drop tune, or find the "
            "value with trainer=gpu first and pass it on"
        )
    _check_one_process_toggles(cfg)
    _check_sharding(cfg)
    _check_ema_unsharded(cfg)
    _check_adam_eps_in_fp16(cfg)
    _check_logger_packages(cfg)
    val, test = (OmegaConf.select(cfg, f"data.{k}_fraction") for k in ("val", "test"))
    if is_number(val) and is_number(test) and val + test >= 1:
        raise ConfigError(
            f"data.val_fraction={val} and data.test_fraction={test} leave no training data: "
            "keep their sum below 1, e.g. data.val_fraction=0.15 data.test_fraction=0.15"
        )


def _check_one_process_toggles(cfg: DictConfig) -> None:
    """trainer=dp runs every GPU's replica from one process: BatchNorm cannot synchronise over
    processes, and a compiled module is bound to the root's copy of the weights."""
    strategy = OmegaConf.select(cfg, "trainer.strategy")
    target = strategy.get("_target_", "") if isinstance(strategy, DictConfig) else str(strategy)
    if not target.endswith("DataParallelStrategy"):
        return
    if OmegaConf.select(cfg, "trainer.sync_batchnorm"):
        raise ConfigError(
            "trainer.sync_batchnorm=true with trainer=dp: DataParallel runs one process, so"
            " BatchNorm has no other processes to synchronise with; use trainer=ddp, or"
            " trainer.sync_batchnorm=false"
        )
    if OmegaConf.select(cfg, "compile.mode"):
        raise ConfigError(
            f"compile={OmegaConf.select(cfg, 'compile.mode')} with trainer=dp: DataParallel"
            " copies the module to every GPU each step, which a compiled module does not survive;"
            " use trainer=ddp, or compile=off"
        )


def _check_logger_packages(cfg: DictConfig) -> None:
    """A logger whose package is missing would fail only once the Trainer is built."""
    loggers = cfg.get("logger")
    if not isinstance(loggers, DictConfig):
        return
    for name in map(str, loggers):
        entry = loggers[name]
        target = str(entry.get("_target_", "")) if isinstance(entry, DictConfig) else ""
        package = LOGGER_PACKAGES.get(target.rsplit(".", 1)[-1])
        if package is not None and importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"logger.{name} ({target}) needs the {package} package, which is not installed:"
                f" {LOGGERS_EXTRA}, or choose another logger (e.g. logger=tensorboard)"
            )


def _check_ema_unsharded(cfg: DictConfig) -> None:
    """ema keeps a whole copy of the module on every rank and averages it parameter by parameter
    against the module's: under a sharded strategy each rank holds only shards to average."""
    strategy = OmegaConf.select(cfg, "trainer.strategy")
    target = strategy.get("_target_", "") if isinstance(strategy, DictConfig) else str(strategy)
    ema = cfg.get("ema")
    if ema is not None and any(name in target.lower() for name in ("fsdp", "deepspeed")):
        raise ConfigError(
            f"ema={ema} with trainer.strategy={target}: the average needs the whole module on"
            " every rank, which a sharded strategy does not keep; use trainer=ddp, or ema=null"
        )


# What Lightning's FSDP2 strategy (under volt's trainer=fsdp) trains in: 16-mixed would need a
# gradient scaler for sharded gradients, which it has not; 64-true it refuses.
FSDP_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-true")


def _check_sharding(cfg: DictConfig) -> None:
    """trainer=fsdp's precisions and toggles; Lightning's own FSDP by name is pointed to it."""
    strategy = OmegaConf.select(cfg, "trainer.strategy")
    if isinstance(strategy, str) and strategy.lower().startswith("fsdp"):
        raise ConfigError(
            f"trainer.strategy={strategy}: Lightning's FSDP1 re-runs the command line for each"
            " rank (under -m, a sweep per rank) and runs on CUDA only; use trainer=fsdp"
        )
    target = strategy.get("_target_", "") if isinstance(strategy, DictConfig) else ""
    if not target.endswith("strategies.fsdp.FSDPStrategy"):
        return
    precision = cfg.get("precision")
    if precision not in FSDP_PRECISIONS:
        raise ConfigError(
            f"precision={precision} with trainer=fsdp: sharded training runs in "
            f"{', '.join(FSDP_PRECISIONS)} only; use precision=bf16-mixed (or 32-true)"
        )
    if OmegaConf.select(cfg, "trainer.sync_batchnorm"):
        raise ConfigError(
            "trainer.sync_batchnorm=true with trainer=fsdp: volt synchronises BatchNorm under"
            " trainer=ddp only; use trainer=ddp, or trainer.sync_batchnorm=false"
        )


ADAMS = ("Adam", "AdamW", "NAdam", "RAdam", "Adamax")


def _check_adam_eps_in_fp16(cfg: DictConfig) -> None:
    """Under 16-true the optimizer's state is fp16, whose smallest value is 6e-8: Adam's default
    eps of 1e-8 rounds to 0 and the first update divides by zero (NaN at step 1)."""
    target = str(OmegaConf.select(cfg, "model.optimizer._target_", default=""))
    if cfg.get("precision") != "16-true" or target.rsplit(".", 1)[-1] not in ADAMS:
        return
    eps = OmegaConf.select(cfg, "model.optimizer.eps", default=1e-8)
    if is_number(eps) and eps < 6e-8:
        raise ConfigError(
            f"precision=16-true with model.optimizer.eps={eps}: fp16 rounds it to 0 and Adam"
            " divides by zero; set model.optimizer.eps=1e-4, or use precision=16-mixed / bf16-true"
        )


def check_resolves(cfg: DictConfig) -> None:
    """Every interpolation resolves (run inside a job, where Hydra's runtime values exist)."""
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None) or "config"
        raise ConfigError(f"{key}: {getattr(error, 'msg', error)}") from error


def check_machine(cfg: DictConfig) -> None:
    """The requested accelerator exists here and takes the devices asked for (Lightning would
    fail later, with a traceback, after the run directory exists)."""
    import torch

    accelerator = OmegaConf.select(cfg, "trainer.accelerator") or cfg.get("accelerator")
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"trainer.accelerator={accelerator!r} but no CUDA GPU is visible here "
            "(torch.cuda.is_available() is False): use trainer=cpu, or trainer.accelerator=auto"
        )
    devices = OmegaConf.select(cfg, "trainer.devices")
    available = torch.cuda.device_count()
    on_gpus = accelerator in ("gpu", "cuda") or (accelerator == "auto" and available)
    if on_gpus and is_int(devices) and devices > available:
        raise ConfigError(
            f"trainer.devices={devices} but {available} GPU(s) are visible here: "
            f"use trainer.devices={available} (or -1 for all), or check CUDA_VISIBLE_DEVICES"
        )
    strategy = OmegaConf.select(cfg, "trainer.strategy")
    target = strategy.get("_target_", "") if isinstance(strategy, DictConfig) else str(strategy)
    nodes = OmegaConf.select(cfg, "trainer.num_nodes", default=1)
    batch = OmegaConf.select(cfg, "data.batch_size")
    data_parallel = "ddp" in target.lower() or "fsdp" in target.lower()
    if data_parallel and is_int(devices) and is_int(batch) and is_int(nodes):
        processes = devices * nodes
        if batch % processes:
            raise ConfigError(
                f"data.batch_size={batch} does not divide over {processes} processes: "
                f"use a multiple of {processes}, "
                f"e.g. data.batch_size={max(1, batch // processes) * processes}"
            )
    precision = str(cfg.get("precision"))
    on_gpu = accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()
    if precision.startswith("bf16") and on_gpu and not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name()
        raise ConfigError(
            f"precision={precision} but {name} has no bfloat16 support: "
            "use precision=16-mixed (with gradient scaling) or precision=32-true"
        )
    if cfg.get("float8"):
        reason = float8_unavailable()
        if reason is not None:
            raise ConfigError(reason)
    check_trainer_flags(cfg)
