"""volt's config layer is silent on every OmegaConf and Hydra it supports: importing volt.config
(which registers its resolvers) and composing and resolving the train config warns of nothing
that volt's code, OmegaConf or Hydra raises. OmegaConf 2.4 deprecates register_new_resolver with a
UserWarning per call, pinned on the caller's line: the check counts warnings by where they point
(volt, omegaconf, hydra), so a deprecated call put back in volt fails it under 2.4."""

import json
import os
import subprocess
import sys
import warnings
from itertools import count
from pathlib import Path

import hydra
import omegaconf
import pytest
from omegaconf import OmegaConf

import volt
from volt.config import PROJECT_ROOT, ROOT_VARIABLE, register_resolver

CATEGORIES = (DeprecationWarning, FutureWarning, UserWarning)
# Where a counted warning may point: the caller's line (volt) for a deprecated call, the library's
# own for what it does wrong by itself.
ORIGINS = tuple(
    Path(f).resolve().parent for f in (volt.__file__, omegaconf.__file__, hydra.__file__)
)

# Run in a fresh interpreter: this one imported volt.config (and registered its resolvers) while
# pytest collected the tests. Prints every warning as JSON; the test decides which count.
COMPOSE_AND_RESOLVE = """
import json, sys, tempfile, warnings

with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    import volt.config
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    out = tempfile.mkdtemp()
    # As tests/conftest.py composes; trainer=ddp and the Optuna search use the resolvers
    # the default config does not (volt.devices_per_node, volt.direction).
    for overrides in ([], ["trainer=ddp", "hparams_search=digits_optuna"]):
        with initialize_config_dir(str(volt.config.CONF_DIR), version_base="1.3"):
            cfg = compose(
                "train", [f"paths.outputs_dir={out}", *overrides], return_hydra_config=True
            )
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = out
            cfg.hydra.job.name = "train"
        HydraConfig.instance().set_config(cfg)
        for section in ("run", "job_logging", "sweeper"):
            OmegaConf.to_container(cfg.hydra[section], resolve=True)
        cfg.hydra.sweep.dir  # its subdir needs a job number
        with open_dict(cfg):
            del cfg["hydra"]
        OmegaConf.to_container(cfg, resolve=True)
json.dump(
    [
        {"classes": [c.__name__ for c in w.category.__mro__], "filename": w.filename,
         "lineno": w.lineno, "message": str(w.message)}
        for w in seen
    ],
    sys.stdout,
)
"""


def counted(seen: list[dict]) -> list[str]:
    """The warnings of `seen` (as COMPOSE_AND_RESOLVE prints them) that are of CATEGORIES and
    point into ORIGINS, one line each."""
    names = {c.__name__ for c in CATEGORIES}
    found = []
    for w in seen:
        where = Path(w["filename"]).resolve()
        if names & set(w["classes"]) and any(where.is_relative_to(o) for o in ORIGINS):
            first = w["message"].strip().splitlines()[0]
            found.append(f"{w['filename']}:{w['lineno']}: {w['classes'][0]}: {first}")
    return found


def test_config_layer_emits_no_library_warning() -> None:
    env = {**os.environ, ROOT_VARIABLE: str(PROJECT_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", COMPOSE_AND_RESOLVE],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout)
    versions = f"omegaconf {omegaconf.__version__}, hydra-core {hydra.__version__}"
    assert counted(seen) == [], versions


VOLT_CONFIG = str(Path(volt.__file__).parent / "config" / "__init__.py")


@pytest.mark.parametrize(
    ("filename", "classes", "counts"),
    [
        # OmegaConf 2.4's register_new_resolver warning, pinned on volt's calling line.
        (VOLT_CONFIG, ["UserWarning", "Warning"], True),
        # A Hydra migration warning: a subclass of UserWarning, pinned inside Hydra.
        (str(Path(hydra.__file__).parent / "main.py"), ["HydraXMigration", "UserWarning"], True),
        (str(Path(omegaconf.__file__).parent / "omegaconf.py"), ["FutureWarning"], True),
        (str(Path(hydra.__file__).parent / "core" / "utils.py"), ["DeprecationWarning"], True),
        # The harness's own compose call (its version_base), other libraries, other categories.
        (__file__, ["UserWarning"], False),
        (str(Path(pytest.__file__).parent / "x.py"), ["UserWarning"], False),
        (VOLT_CONFIG, ["ResourceWarning", "Warning"], False),
    ],
)
def test_counted_warnings_are_those_volt_and_the_libraries_raise(
    filename: str, classes: list[str], counts: bool
) -> None:
    seen = [{"classes": classes, "filename": filename, "lineno": 1, "message": "m\nmore"}]
    assert bool(counted(seen)) is counts


def test_register_resolver_is_silent_replaces_and_caches() -> None:
    calls = count()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        register_resolver("volt_test_once", lambda: "first")
        register_resolver("volt_test_once", lambda: next(calls), use_cache=True)
    assert [str(w.message) for w in seen] == []
    cfg = OmegaConf.create({"a": "${volt_test_once:}", "b": "${volt_test_once:}"})
    assert (cfg.a, cfg.b, cfg.a) == (0, 0, 0)  # replaced, and called once: cached
