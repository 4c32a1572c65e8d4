"""The allow-list of callables a config may name (volt.config.targets), case by case."""

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from volt.config import CONF_DIR, register_resolver
from volt.config.targets import check_stored_config, check_targets
from volt.errors import ConfigError


def shipped_targets() -> list[str]:
    """Every `_target_` volt's own configs name outside `hydra:` (Hydra builds those itself)."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            found.update([node["_target_"]] if "_target_" in node else [])
            for key, value in node.items():
                if key != "hydra":
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in CONF_DIR.rglob("*.yaml"):
        if "hydra" not in path.relative_to(CONF_DIR).parts:
            walk(yaml.safe_load(path.read_text()))
    return sorted(found)


def test_every_shipped_target_is_allowed() -> None:
    targets = shipped_targets()
    assert "torch.optim.AdamW" in targets and "lightning.pytorch.Trainer" in targets
    check_targets({"group": [{"_target_": t} for t in targets]}, trusted=[])


REFUSED: list[tuple[str, Any, str, str]] = [
    # (id, config, key named in the message, why)
    ("stdlib", {"a": {"_target_": "os.system"}}, "a: _target_=os.system", "trusted_targets=[os]"),
    ("builtins", {"a": {"_target_": "builtins.getattr"}}, "a: _target_=builtins", "is not allowed"),
    ("torch.hub", {"m": {"_target_": "torch.hub.load"}}, "m: _target_=torch.hub.load", "allowed"),
    (
        "attribute chain",  # lies in torch.optim as text, is torch.save
        {"m": {"net": {"_target_": "torch.optim.optimizer.torch.save"}}},
        "m.net: _target_=torch.optim.optimizer.torch.save",
        "it is torch.serialization.save, reached through another module",
    ),
    (
        "chain through a volt room",
        {"m": {"_target_": "volt.data.digits.torch.save"}},
        "m: _target_=volt.data.digits.torch.save",
        "it is torch.serialization.save",
    ),
    (
        "re-export in a volt room",
        {"m": {"_target_": "volt.models.classifier.MeanMetric"}},
        "m: _target_=volt.models.classifier.MeanMetric",
        "it is torchmetrics.aggregation.MeanMetric",
    ),
    # volt's entry points and build functions take a config or a trust list of their own: a
    # config naming one would hand them its own (issue #31).
    ("volt's build", {"m": {"_target_": "volt.build.build_model"}}, "m:", "never buildable"),
    ("volt's training", {"m": {"_target_": "volt.training.train"}}, "m:", "never buildable"),
    ("volt's eval", {"m": {"_target_": "volt.evaluation.evaluate"}}, "m:", "never buildable"),
    (
        "volt's rebuild",
        {"m": {"_target_": "volt.rebuild.load_trained_module"}},
        "m:",
        "never buildable",
    ),
    (
        "volt's records",
        {"m": {"_target_": "volt.runs.records.write_metrics"}},
        "m:",
        "never buildable",
    ),
    (
        "volt's printer",
        {"m": {"_target_": "volt.console.print_config_tree"}},
        "m:",
        "never buildable",
    ),
    (
        "method",
        {"o": {"_target_": "torch.optim.AdamW.zero_grad"}},
        "o: _target_=torch.optim.AdamW.zero_grad",
        "not a module-level class or function",
    ),
    ("dunder", {"o": {"_target_": "torch.optim.AdamW.__init__"}}, "o:", "'__init__' is private"),
    ("private", {"o": {"_target_": "torch.optim._functional.adam"}}, "o:", "'_functional'"),
    (
        "not callable",
        {"o": {"_target_": "volt.strategies.launcher.RANK_ZERO_GRACE_S"}},
        "o:",
        "an int",
    ),
    ("not a path", {"o": {"_target_": "torch..optim"}}, "o: _target_='torch..optim'", "dotted"),
    ("not text", {"o": {"_target_": {"_target_": "os.system"}}}, "o: _target_={", "dotted path"),
    ("prefix at a dot only", {"o": {"_target_": "voltage.X"}}, "o: _target_=voltage.X", "allowed"),
    ("in a list", {"cb": [1, {"_target_": "os.system"}]}, "cb[1]: _target_=os.system", "allowed"),
    (
        "in _args_",
        {"n": {"_target_": "torch.optim.AdamW", "_args_": [{"_target_": "os.system"}]}},
        "n._args_[0]: _target_=os.system",
        "allowed",
    ),
    (
        "below _recursive_: false",
        {
            "n": {
                "_target_": "torch.optim.AdamW",
                "_recursive_": False,
                "x": {"_target_": "os.popen"},
            }
        },
        "n.x: _target_=os.popen",
        "allowed",
    ),
    ("top-level list", [{"_target_": "os.system"}], "[0]: _target_=os.system", "allowed"),
    (
        "missing",
        {"n": {"_target_": "volt.nets.nope.X"}},
        "n: _target_=volt.nets.nope.X",
        "cannot be found",
    ),
]


@pytest.mark.parametrize(
    ("config", "key", "why"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_refused(config: Any, key: str, why: str) -> None:
    with pytest.raises(ConfigError) as refused:
        check_targets(config, trusted=[])
    message = str(refused.value)
    assert message.startswith(key), message
    assert why in message, message
    assert "\n" not in message


@pytest.fixture
def payload_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package `a_payload` whose import writes `imported`: shows what was imported when."""
    package = tmp_path / "a_payload"
    package.mkdir()
    (package / "__init__.py").write_text(
        f"open({str(tmp_path / 'imported')!r}, 'w').close()\n\ndef build():\n    return 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "imported"
    sys.modules.pop("a_payload", None)


def test_paths_are_refused_before_anything_is_imported(payload_package: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("a_payload.build is not allowed")):
        check_targets({"a": {"_target_": "a_payload.build"}}, trusted=[])
    # Trusted, but another target is not: every path is checked before the first is resolved.
    config = {"a": {"_target_": "a_payload.build"}, "b": {"_target_": "os.system"}}
    with pytest.raises(ConfigError, match=re.escape("b: _target_=os.system")):
        check_targets(config, trusted=["a_payload"])
    assert not payload_package.exists()
    assert "a_payload" not in sys.modules


def test_trusted_targets_widen_the_list(payload_package: Path) -> None:
    check_targets({"a": {"_target_": "a_payload.build"}}, trusted=["a_payload."])
    assert payload_package.exists()  # resolved the way instantiate would: by importing it
    check_targets({"a": {"_target_": "json.dumps"}}, trusted=["json.dumps"])  # one name
    with pytest.raises(ConfigError, match=re.escape("json.loads is not allowed")):
        check_targets({"a": {"_target_": "json.loads"}}, trusted=["json.dumps"])
    with pytest.raises(ConfigError, match=re.escape("jsonx.f is not allowed")):
        check_targets({"a": {"_target_": "jsonx.f"}}, trusted=["json"])


@pytest.mark.parametrize("trusted", ["mypkg", [""], [3], ["my pkg"], ["${oc.env:X}"], None])
def test_bad_trusted_targets(trusted: Any) -> None:
    with pytest.raises(ConfigError, match=r"trusted_targets.* is not valid: .*trusted_targets=\["):
        check_targets({}, trusted=trusted)


def test_a_live_config_is_checked_as_resolved() -> None:
    config = OmegaConf.create({"name": "os.system", "a": {"_target_": "${name}"}})
    with pytest.raises(ConfigError, match=re.escape("a: _target_=os.system is not allowed")):
        check_targets(config, trusted=[])


STORED_REFUSED = [
    "${oc.decode:'{_target_: torch.save}'}",  # builds a target the check never saw
    "${oc.create:{a: 1}}",
    "${model.net}",
    "${volt.project_root:}",
    "${oc.env:X,${oc.decode:'{a: 1}'}}",  # an environment read whose default is not plain
    "prefix ${oc.env:X} then ${other}",
    "\\\\${other}",  # an escaped backslash, then a real interpolation
]


@pytest.mark.parametrize("value", STORED_REFUSED)
def test_stored_interpolations_are_refused(value: str) -> None:
    stored = OmegaConf.create({"model": {"net": {"sizes": [1, value]}}})
    with pytest.raises(ConfigError, match=r"^model\.net\.sizes\[1\]: .+ is not allowed"):
        check_stored_config(stored, trusted=[])


def test_stored_interpolations_are_refused_unresolved() -> None:
    calls: list[str] = []
    register_resolver("a_probe", lambda: calls.append("ran") or 0)
    try:
        with pytest.raises(ConfigError, match=r"x: '\$\{a_probe:\}' is not allowed"):
            check_stored_config(OmegaConf.create({"x": "${a_probe:}"}), trusted=[])
    finally:
        OmegaConf.clear_resolver("a_probe")
    assert calls == []


@pytest.mark.parametrize(
    "value",
    [
        "${oc.env:WANDB_API_KEY}",
        "Bearer ${oc.env:T}",
        "${oc.env:T,fallback}",
        "${oc.decode:${oc.env:N}}",
        "\\${literal}",
    ],
)
def test_stored_environment_reads_pass(value: str) -> None:
    """volt writes values read from the environment as `${oc.env:NAME}` (volt.config.redaction):
    eval and the DDP ranks read them again from their own environment; nothing else runs."""
    check_stored_config({"logger": {"api_key": value}}, [])


def test_stored_config_is_checked_for_targets_too() -> None:
    stored = {"trusted_targets": ["os"], "model": {"net": {"_target_": "os.system"}}}
    with pytest.raises(
        ConfigError, match=re.escape("model.net: _target_=os.system is not allowed")
    ):
        check_stored_config(stored, trusted=[])  # the file's own list is not the caller's
