"""What `--help` lists under "Configuration groups" (conf/hydra/default.yaml's help template):
each group and the options a user picks with `group=option`, as Hydra's `$APP_CONFIG_GROUPS`
lists them, less the files of conf/callbacks/ that hold callbacks. Those are entries that the
options (default, eval) and experiments include; `callbacks=throughput` would train with that
one callback alone, no checkpoint among them. A user's own callbacks file, on an added search
path too, is an entry as well. The groups of conf/logger/ hold one logger a file too, and
`logger=csv` is a real choice: only callbacks is a group of entries."""

from typing import Any

from hydra.core.config_loader import ConfigLoader
from hydra.core.global_hydra import GlobalHydra
from hydra.core.object_type import ObjectType
from omegaconf import DictConfig

ENTRY_GROUPS = ("callbacks",)


def config_groups() -> str:
    """`group: option, option` a line, the groups sorted, Hydra's own (hydra/...) left out."""
    loader = GlobalHydra.instance().config_loader()
    lines = []
    for group in sorted(_groups(loader, "")):
        options = sorted(loader.get_group_options(group))
        if group in ENTRY_GROUPS:
            options = [o for o in options if not _holds_callbacks(loader, f"{group}/{o}")]
        lines.append(f"{group}: {', '.join(options)}")
    return "\n".join(lines)


def _groups(loader: ConfigLoader, parent: str) -> list[str]:
    """Every group under `parent` that holds config files, nested ones included."""
    found = []
    for name in loader.list_groups(parent):
        group = f"{parent}/{name}" if parent else name
        if group == "hydra":
            continue
        if loader.get_group_options(group, ObjectType.CONFIG):
            found.append(group)
        found += _groups(loader, group)
    return found


def _holds_callbacks(loader: ConfigLoader, path: str) -> bool:
    """The file at `path` (without `.yaml`), from the first source of the search path that has
    it, as Hydra picks it: whether its own body (its defaults list aside) builds something."""
    for source in loader.get_sources():
        if source.is_config(path):
            body: Any = source.load_config(path).config
            return isinstance(body, DictConfig) and any(
                isinstance(node, DictConfig) and "_target_" in node
                for key, node in body.items()
                if key != "defaults"
            )
    return False
