"""The narrow rules for a stored config's model and data (volt.config.stored), one by one."""

import copy
from pathlib import Path
from typing import Any

import pytest

from volt.config.stored import check_stored_precision, check_stored_sections
from volt.errors import ConfigError

GENUINE: dict[str, Any] = {
    "model": {
        "_target_": "volt.models.classifier.Classifier",
        "net": {
            "_target_": "volt.nets.mlp.MLP",
            "hidden_sizes": [8],
            "in_shape": [1, 8, 8],
            "num_classes": 10,
            "activation": {"_target_": "torch.nn.ReLU"},
        },
        "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 0.003},
        "scheduler": {
            "_target_": "torch.optim.lr_scheduler.CosineAnnealingLR",
            "_partial_": True,
            "T_max": 3,
        },
        "monitor": "val/loss",  # a slash is not a place
    },
    "data": {
        "_target_": "volt.data.digits.DigitsDataModule",
        "batch_size": 64,
        "on_device": "auto",
    },
    # Never read: whatever is here does not matter.
    "trainer": {"_target_": "os.system", "command": "echo"},
    "trusted_targets": ["os"],
}


def check(stored: dict[str, Any], data_dir: Path, **kwargs: Any) -> None:
    given = {"trusted": [], "allow_env": [], "data_dir": data_dir, **kwargs}
    check_stored_sections(stored, **given)


def changed(path: str, value: Any) -> dict[str, Any]:
    stored = copy.deepcopy(GENUINE)
    *parents, last = path.split(".")
    node = stored
    for key in parents:
        node = node[key]
    node[last] = value
    return stored


def test_a_genuine_config_passes_and_the_other_sections_are_not_read(tmp_path: Path) -> None:
    check(GENUINE, tmp_path)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("model", {"_target_": "volt.nets.mlp.MLP"}, "builds a LightningModule here"),
        ("data", {"_target_": "volt.models.classifier.Classifier"}, "LightningDataModule here"),
        ("model.net", {"_target_": "volt.data.digits.DigitsDataModule"}, "builds a Module here"),
        ("model.net._partial_", True, "builds an Optimizer or LRScheduler here"),
        ("model._partial_", True, "model._partial_=True is not allowed here"),
        ("model.net._partial_", "yes", "model.net._partial_='yes' is not allowed"),
        ("model.net._convert_", "all", "model.net._convert_ is not allowed"),
        ("model.net.activation", {"_target_": "torch.nn.functional.relu"}, "defined in"),
        ("model.optimizer", {"_target_": "torch.optim.AdamW"}, "builds a Module here"),
        ("model", None, "model: the checkpoint's config holds no model section"),
        ("data", "digits", "data: the checkpoint's config holds no data section"),
    ],
)
def test_refused(path: str, value: Any, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check(changed(path, value), tmp_path)


def test_a_trusted_package_widens_the_classes_but_not_their_kind(tmp_path: Path) -> None:
    # TensorDataset is a class but not a module: trusting torch.utils does not make it one.
    stored = changed("model.net.extra", {"_target_": "torch.utils.data.TensorDataset"})
    with pytest.raises(ConfigError, match="is not allowed: a stored config names only"):
        check(stored, tmp_path)
    with pytest.raises(ConfigError, match="builds a Module here, and it is not one"):
        check(stored, tmp_path, trusted=["torch.utils"])


@pytest.mark.parametrize(
    "value",
    ["${oc.env:HOME}", "${oc.decode:'1'}", "${model.net.hidden_sizes}", "a ${oc.env:HOME} b"],
)
def test_interpolations_are_refused_at_ordinary_keys(value: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="a stored config holds plain values"):
        check(changed("model.net.dropout", value), tmp_path)


def test_an_environment_read_at_a_secret_key_needs_the_users_word(tmp_path: Path) -> None:
    stored = changed("data.api_key", "${oc.env:VOLT_TEST_TOKEN}")
    with pytest.raises(ConfigError, match=r"add allow_env=\[VOLT_TEST_TOKEN\] to your command"):
        check(stored, tmp_path)
    with pytest.raises(ConfigError, match="allow_env"):
        check(stored, tmp_path, allow_env=["OTHER"])
    check(stored, tmp_path, allow_env=["VOLT_TEST_TOKEN"])


def test_an_interpolation_in_a_key_is_refused(tmp_path: Path) -> None:
    stored = changed("model.net.extra", {"${oc.env:HOME}": 1})
    with pytest.raises(ConfigError, match="is not allowed in a stored config"):
        check(stored, tmp_path)


@pytest.mark.parametrize(
    "place",
    ["/etc/passwd", "~/.ssh/id_rsa", "../outside", "file:///etc/passwd", "s3://bucket/x", "."],
)
def test_places_outside_the_data_folder_are_refused(
    place: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with pytest.raises(ConfigError, match="lies outside this project's data folder"):
        check(changed("data.root", place), data_dir)


def test_an_existing_relative_path_counts_as_a_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    (tmp_path / "data").mkdir()
    with pytest.raises(ConfigError, match=r"data.cache_dir='train.py' is not allowed"):
        check(changed("data.cache_dir", "train.py"), tmp_path / "data")
    check(changed("data.cache_dir", "data/text"), tmp_path / "data")  # inside: allowed
    check(changed("data.root", str(tmp_path / "data" / "mnist")), tmp_path / "data")


@pytest.mark.parametrize("value", ["bf16-mixed", "32-true", None])
def test_known_precisions_pass(value: str | None) -> None:
    check_stored_precision(value)


@pytest.mark.parametrize("value", ["transformer-engine", "${oc.env:HOME}", 3])
def test_other_precisions_are_refused(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"give precision=\.\.\. on the command line"):
        check_stored_precision(value)


def test_an_explicit_device_is_refused(tmp_path: Path) -> None:
    """A device given to a layer beats the meta device volt sizes a stored model on."""
    stored = changed("model.net.activation", {"_target_": "torch.nn.Linear", "device": "cpu"})
    with pytest.raises(ConfigError, match=r"model\.net\.activation\.device is not allowed"):
        check(stored, tmp_path)


@pytest.mark.parametrize("place", ["escaped/deep/cache", "", "data_but_not/inside"])
def test_a_path_argument_is_a_place_even_when_relative_and_new(
    place: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TextBytesDataModule's cache_dir is annotated as a path: whatever it holds is where the
    module writes, existing or not, relative or empty (the working directory)."""
    monkeypatch.chdir(tmp_path)
    stored = changed(
        "data",
        {"_target_": "volt.data.text_bytes.TextBytesDataModule", "cache_dir": place},
    )
    with pytest.raises(ConfigError, match=r"data\.cache_dir=.* lies outside"):
        check(stored, tmp_path / "data")
    inside = copy.deepcopy(stored)
    inside["data"]["cache_dir"] = "data/text"
    check(inside, tmp_path / "data")


def test_a_key_with_control_characters_is_refused(tmp_path: Path) -> None:
    stored = changed("model.net.extra", {"\x1b]0;pwned\x07": 1})
    with pytest.raises(ConfigError, match="is not allowed in a stored config"):
        check(stored, tmp_path)
