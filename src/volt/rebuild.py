"""A trained run rebuilt from its checkpoint alone: `volt.eval` (test, predict) and
`load_trained_module`. The file may come from a stranger, so only its `model` and `data` are read,
through the narrow checks of `volt.config.stored`; the trainer, callbacks, loggers, precision
choices and the task come from the user's command and local config, built by `volt.build` as in
training. The model is built on the meta device first, and its parameter shapes compared with the
checkpoint's tensors: a config that disagrees with the weights, or that would need more memory
than they hold, is refused before any memory is taken.
"""

import copy
import zipfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from volt.build import (
    TrainingObjects,
    apply_toggles,
    build_datamodule,
    build_trainer,
    model_with_data,
)
from volt.callbacks.prediction_writer import CSVPredictionWriter
from volt.checkpointing import (
    read_stored_checkpoint,
    read_trained_weights,
    weights_disagreement,
)
from volt.config import PROJECT_ROOT
from volt.config.execution_whitelist import instantiate_whitelist
from volt.config.stored import (
    SECTIONS,
    check_stored_precision,
    check_stored_sections,
    stored_prefixes,
)
from volt.console import one_line
from volt.errors import ConfigError

# Room the rebuilt module may take beyond the checkpoint's tensors: buffers a module computes
# rather than stores (a causal mask, rotary tables), and per-tensor overhead.
EXTRA_BYTES_ALLOWED = 256 * 2**20
EXTRA_RATIO_ALLOWED = 1.25
# Sizes a stored model sets that cost time or memory its weights do not show, and their caps
# (conf/eval.yaml's keys of the same names raise them): a checkpoint's `max_new_tokens: 10**9`
# would predict for days.
STORED_CAPS = {"max_new_tokens": 1024}


@dataclass(frozen=True)
class StoredRun:
    """The parts of a checkpoint volt rebuilds from, checked (`volt.config.stored`)."""

    model: dict[str, Any]
    data: dict[str, Any] | None  # None: the command names its own data
    precision: str | None
    channels_last: bool
    weights: dict[str, torch.Tensor]  # the state_dict mapped from the file, not read
    prefixes: tuple[str, ...]  # where its targets were checked to lie, Hydra's whitelist too

    def instantiate(self, section: DictConfig) -> Any:
        """Hydra's instantiate on a section of this run, checked already."""
        return instantiate(section, **instantiate_whitelist(self.prefixes))


def read_stored_run(
    ckpt_path: str | Path,
    trusted: Iterable[Any],
    allow_env: Iterable[str],
    data_dir: Path,
    data_overrides: Mapping[str, Any] | None = None,
    caps: Mapping[str, int] = STORED_CAPS,
) -> StoredRun:
    """The checkpoint's model and data sections, checked; `data_overrides` (the command's
    `data_root`, `batch_size`, `prompt`) replace the file's values before the check. With
    `data_overrides=None` the command brings its own data and the stored one is not read.
    `caps`: the largest value each key of STORED_CAPS may have, wherever the model sets it."""
    path = Path(ckpt_path)
    if path.is_file() and not zipfile.is_zipfile(path):  # what torch.save (and Lightning) write
        raise ConfigError(
            f"ckpt_path={str(ckpt_path)!r} is not a checkpoint: give a .ckpt file a run wrote"
            " (<run>/checkpoints/), or a sharded checkpoint's folder"
        )
    try:
        config, weights = read_stored_checkpoint(path)
    except Exception as error:  # unreadable, truncated, or not volt's: the user needs the file name
        raise ConfigError(f"ckpt_path={str(ckpt_path)!r} cannot be used: {error}") from error
    model = copy.deepcopy(config.get("model"))
    if isinstance(model, dict):
        model.pop("channels_last", None)  # a Classifier argument before 2026-11-23
    data = copy.deepcopy(config.get("data"))
    if data_overrides is not None and isinstance(data, dict):
        data.update({k: v for k, v in data_overrides.items() if v is not None})
    sections = SECTIONS if data_overrides is not None else ("model",)
    check_stored_sections({"model": model, "data": data}, trusted, allow_env, data_dir, sections)
    assert isinstance(model, dict)  # checked above
    _check_caps(model, "model", caps)
    check_stored_precision(config.get("precision"))
    channels_last = config.get("channels_last") or config.get("model", {}).get("channels_last")
    if channels_last not in (None, True, False):
        raise ConfigError(f"channels_last: the checkpoint's {channels_last!r} is not a boolean")
    return StoredRun(
        model=model,
        data=data if data_overrides is not None else None,
        precision=config.get("precision"),
        channels_last=bool(channels_last),
        weights=weights,
        prefixes=stored_prefixes(trusted),
    )


def data_overrides(cfg: DictConfig) -> dict[str, Any]:
    """What an eval command changes in the data module: batch size, data root, prompt."""
    given = {"batch_size": cfg.batch_size, "root": cfg.data_root, "prompt": cfg.prompt}
    return {k: v for k, v in given.items() if v is not None}


def read_evaluated_run(cfg: DictConfig) -> StoredRun:
    """The checked StoredRun of an eval command's `ckpt_path`, its data as the command changes it
    (or not read at all when the command names its own data)."""
    overrides = None if cfg.get("data") is not None else data_overrides(cfg)
    caps = {key: cfg[key] for key in STORED_CAPS}
    data_dir = Path(cfg.paths.data_dir)
    return read_stored_run(
        cfg.ckpt_path, cfg.trusted_targets, cfg.allow_env, data_dir, overrides, caps
    )


def _check_caps(node: Any, key: str, caps: Mapping[str, int]) -> None:
    if isinstance(node, Mapping):
        for name, value in node.items():
            cap = caps.get(name)
            if cap is not None and isinstance(value, int) and value > cap:
                raise ConfigError(
                    f"{key}.{name}={value} is more than {name}={cap} allows: the checkpoint sets"
                    f" it, and it costs time or memory its weights do not show; add"
                    f" {name}={value} to the command if you trust the file"
                )
            _check_caps(value, f"{key}.{name}", caps)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_caps(value, f"{key}[{i}]", caps)


def build_stored_model(
    stored: StoredRun, datamodule: pl.LightningDataModule, from_data: Mapping[str, str]
) -> pl.LightningModule:
    """The LightningModule of `stored`, once its meta-device twin has the checkpoint's shapes and
    needs no more memory than the checkpoint's tensors (plus EXTRA_*_ALLOWED)."""
    model_cfg = model_with_data(OmegaConf.create(stored.model), datamodule, from_data)
    try:
        with torch.device("meta"), modules_at_most(_module_budget(stored.weights)):
            twin = stored.instantiate(model_cfg)
    # A constructor's missing argument: hydra-core 1.3 wraps it in an InstantiationException,
    # 1.4 (seen: 1.4.0rc3) lets the TypeError through. Catch the TypeError alone once volt
    # requires hydra-core>=1.4.
    except (InstantiationException, TypeError) as error:
        if isinstance(error.__cause__, ConfigError):  # modules_at_most's refusal
            raise error.__cause__ from error
        if from_data:
            raise
        # Checkpoints before 2026-11-26 stored the model config without the values the task
        # took from the data module (shapes, class counts): the task has to be named.
        raise ConfigError(
            f"model: the checkpoint's model does not build ({one_line(error)}); a checkpoint"
            " written before 2026-11-26 needs the task it was trained with:"
            " task=classification (or task=language_model)"
        ) from error
    _check_against_weights(twin, stored.weights)
    model = stored.instantiate(model_cfg)
    bound_first_forward(model, _memory_allowed(stored.weights))
    return model


def _memory_allowed(weights: Mapping[str, torch.Tensor]) -> int:
    stored_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    return int(stored_bytes * EXTRA_RATIO_ALLOWED) + EXTRA_BYTES_ALLOWED


def bound_first_forward(model: torch.nn.Module, budget: int) -> None:
    """Until the first forward through `model` (or a part of it) ends, each layer's output is
    worked out on the meta device before the layer runs, and one of more than `budget` bytes
    refused: a layer's arguments size what it makes, not its weights (`ZeroPad2d(2000)` is a
    24 KB checkpoint and 4.9 GB at its first forward). Later forwards see the same shapes."""
    names = {module: name or "model" for name, module in model.named_modules()}
    handles: list[torch.utils.hooks.RemovableHandle] = []
    depth = 0

    def enter(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        nonlocal depth
        depth += 1
        if next(module.children(), None) is None:  # a layer: what its output takes
            made = _output_bytes(module, args, kwargs)
            if made > budget:
                raise ConfigError(
                    f"model: its first forward makes {names[module]} ({type(module).__name__})"
                    f" an output of {made / 2**20:,.0f} MiB, more than the {budget / 2**20:,.0f}"
                    " MiB its weights allow: refused before computing it; a smaller"
                    " batch_size=... takes less"
                )

    def leave(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        nonlocal depth
        depth -= 1
        if depth == 0:
            for handle in handles:
                handle.remove()

    for module in names:
        handles.append(module.register_forward_pre_hook(enter, with_kwargs=True))
        handles.append(module.register_forward_hook(leave, with_kwargs=True))


def _output_bytes(layer: torch.nn.Module, args: Any, kwargs: Any) -> int:
    """The bytes `layer`'s output takes, from its forward run on the meta device (0 for a layer
    that does not run there)."""
    twin = copy.copy(layer)  # its own tensors on meta; forward called directly: no hooks
    twin.__dict__["_parameters"] = {k: _on_meta(v) for k, v in layer._parameters.items()}
    twin.__dict__["_buffers"] = {k: _on_meta(v) for k, v in layer._buffers.items()}
    try:
        output = twin.forward(*_on_meta(args), **_on_meta(kwargs))
    except Exception:  # a shape that hangs on the values (nonzero, say) is not measured
        return 0
    return _bytes(output)


def _on_meta(value: Any) -> Any:
    if isinstance(value, torch.nn.Parameter):
        return torch.nn.Parameter(torch.empty_like(value, device="meta"), value.requires_grad)
    if isinstance(value, torch.Tensor):
        return torch.empty_like(value, device="meta")
    if isinstance(value, list | tuple):
        return type(value)(_on_meta(v) for v in value)
    if isinstance(value, dict):
        return {k: _on_meta(v) for k, v in value.items()}
    return value


def _bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_bytes(v) for v in value.values())
    return 0


def _module_budget(weights: Mapping[str, torch.Tensor]) -> int:
    """How many submodules the twin may register: ten for each module the weights name (layers
    without weights, an activation or a dropout, name none), and a margin."""
    owners = {name.rsplit(".", 1)[0] for name in weights if "." in name}
    return 10 * len(owners) + 10_000


@contextmanager
def modules_at_most(budget: int) -> Iterator[None]:
    """Refuses the build at the `budget`-th submodule registered (`n_layer: 10**7` in a stored
    config would otherwise build for hours, on the meta device too, before any shape is seen)."""
    registered = 0

    def count(module: torch.nn.Module, name: str, submodule: torch.nn.Module | None) -> None:
        nonlocal registered
        registered += 1
        if registered > budget:
            raise ConfigError(
                f"model: the checkpoint's config builds more than {budget:,} submodules, far more"
                " than its weights name: refused while building it on the meta device"
            )

    handle = torch.nn.modules.module.register_module_module_registration_hook(count)
    try:
        yield
    finally:
        handle.remove()


def _check_against_weights(twin: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    disagreement = weights_disagreement(twin, weights)
    if disagreement:
        raise ConfigError(
            f"model: the checkpoint's config builds a module its weights do not fit"
            f" ({disagreement}): refused before building it"
        )
    stored_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    tensors = [*twin.parameters(), *twin.buffers()]
    needed = sum(t.numel() * t.element_size() for t in tensors)
    if needed > stored_bytes * EXTRA_RATIO_ALLOWED + EXTRA_BYTES_ALLOWED:
        raise ConfigError(
            f"model: the checkpoint's config builds a module of {needed / 2**20:,.0f} MiB, its"
            f" weights hold {stored_bytes / 2**20:,.0f} MiB: refused before building it"
        )


def build_evaluation(cfg: DictConfig, stored: StoredRun) -> TrainingObjects:
    """Data and model as the checkpoint's run had them (the data replaced by `cfg.data` when the
    command names one, to predict on new data); task, trainer, callbacks, loggers, precision and
    compile from `cfg`, through the same functions as training."""
    trusted = cfg.trusted_targets
    task = cfg.get("task") or OmegaConf.create({"from_data": {}, "module": None})
    if stored.data is not None:
        datamodule = stored.instantiate(OmegaConf.create(stored.data))
    else:
        datamodule = build_datamodule(cfg.data, trusted, **data_overrides(cfg))
    model = build_stored_model(stored, datamodule, task.from_data)
    toggles = OmegaConf.create(
        {
            "task": task,
            "compile": cfg.compile,
            "channels_last": stored.channels_last,
            "trainer": {"sync_batchnorm": False},  # one process: nothing to synchronise
        }
    )
    plugins = apply_toggles(toggles, model)
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.trainer.precision = cfg.precision or stored.precision  # null: as trained
    writer = [CSVPredictionWriter(cfg.paths.output_dir)] if cfg.mode == "predict" else []
    return TrainingObjects(datamodule, model, build_trainer(cfg, trusted, writer, plugins))


def load_trained_module(
    ckpt_path: str | Path,
    trusted: Sequence[str] = (),
    data_dir: str | Path | None = None,
    from_data: Mapping[str, str] | None = None,
) -> tuple[pl.LightningModule, pl.LightningDataModule]:
    """A volt checkpoint's LightningModule with its trained weights, and the data module it was
    built against, from the file (or a sharded checkpoint's folder, read in this one process)
    alone: what `Classifier.load_from_checkpoint` cannot do, since a module's nets and optimiser
    factories are arguments, not hyperparameters (only plain values are, so that checkpoints
    load with weights_only=True). The file is checked as eval checks it;
    `trusted` widens what it may name (your packages), `data_dir` is where its data may live (this
    project's data/ folder by default), and
    `from_data` is for checkpoints written before 2026-11-26, whose model config lacks the values
    taken from the data module (e.g. conf/task/classification.yaml's)."""
    data_dir = Path(data_dir) if data_dir is not None else PROJECT_ROOT / "data"
    stored = read_stored_run(ckpt_path, trusted, (), data_dir, data_overrides={})
    assert stored.data is not None
    datamodule = stored.instantiate(OmegaConf.create(stored.data))
    module = build_stored_model(stored, datamodule, from_data or {})
    module.load_state_dict(read_trained_weights(Path(ckpt_path)))
    return module, datamodule
