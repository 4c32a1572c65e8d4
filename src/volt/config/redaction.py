"""What a run may write down of values read from the environment, and of keys named like secrets.

A value read with `${oc.env:NAME}` (alone, inside a longer string, nested in another resolver or
reached through another key) is written into the run's records, checkpoints and logger
hyperparameters as that interpolation, never as the value: a reader sees where it came from, and
eval, a resumed run and the DDP ranks read it from the environment again. A key whose name says
secret (`says_secret`) must be given that way: Hydra writes a literal into `.hydra/` as given, so
one is refused before Hydra starts the job.
"""

import re
import secrets
from collections.abc import Iterator, Mapping
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import QuotedString
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from volt.errors import ConfigError

KeyPath = tuple[str | int, ...]

# An unescaped `${oc.env:` (`\${` is a literal); OmegaConf allows spaces around the name.
ENV_CALL = re.compile(r"(?<!\\)\$\{\s*oc\.env\s*:")
# A key says secret when its last word is one of these: `api_key`, `apiKey`, `HF_TOKEN`,
# `db_password`, `client_secret`, `key`, `credentials`; not `monitor`, `keys_to_ignore`,
# `max_tokens`, `tokenizer`, `token_dim`, `password_file`. Everything in a list or mapping under
# such a key counts as secret too.
SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "password", "passwd", "passphrase", "secret", "credentials"}
)
# ...except a tokenizer's `<kind>_token`, which holds a vocabulary entry such as `</s>`.
VOCABULARY_TOKENS = frozenset({"pad", "bos", "eos", "unk", "sep", "cls", "mask", "start", "end"})
WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")  # snake_case, camelCase, SCREAMING_CASE
# Where a literal secret would end up, for the refusal.
HYDRA_OVERRIDES = "Hydra would write into .hydra/overrides.yaml"
HYDRA_CONFIG = "Hydra would write into .hydra/config.yaml"
VOLT_RECORDS = "volt would write into config_resolved.yaml and checkpoints"


def _words(name: str) -> list[str]:
    return [w.lower() for w in WORD.findall(name)]


def says_secret(name: str) -> bool:
    words = _words(name)
    if not words or words[-1] not in SECRET_WORDS:
        return False
    return not (words[-1] == "token" and len(words) > 1 and words[-2] in VOCABULARY_TOKENS)


class _EnvMarks:
    """Each `${oc.env:...}` swapped for a word unique to this call, which resolvers pass on as
    plain text: after resolving, a value holding one came from the environment, and putting the
    call's text back in its place gives what may be written down."""

    def __init__(self) -> None:
        self.stem = f"voltenv{secrets.token_hex(4)}n"
        self.calls: list[str] = []
        self.word = re.compile(re.escape(self.stem) + r"(\d+)x")

    def mark(self, value: Any) -> Any:
        """`value` (plain data, interpolations unresolved) with its env calls swapped."""
        if isinstance(value, Mapping):
            return {k: self.mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.mark(v) for v in value]
        if not isinstance(value, str):
            return value
        pieces, end = [], 0
        for match in ENV_CALL.finditer(value):
            if match.start() < end:  # inside the previous call's default
                continue
            pieces.append(value[end : match.start()])
            end = _closing_brace(value, match.start()) + 1
            pieces.append(f"{self.stem}{len(self.calls)}x")
            self.calls.append(value[match.start() : end])
        return "".join(pieces) + value[end:]

    def found_in(self, value: Any) -> bool:
        return isinstance(value, str) and self.word.search(value) is not None

    def unmark(self, text: str) -> str:
        return self.word.sub(lambda m: self.calls[int(m.group(1))], text)


def _closing_brace(text: str, start: int) -> int:
    """Index of the `}` closing the `${` at `start` (a default may hold `${...}` of its own)."""
    depth = 0
    for i in range(start + 1, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ConfigError(f"{text!r} has an unclosed '${{': close it with '}}'")


def _dotted(path: KeyPath) -> str:
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else key)
    return text


def _harmless(value: Any) -> bool:
    """Nothing secret to write: unset (null, or ??? which validation reports), empty, a switch."""
    return value is None or value in ("", "???") or isinstance(value, bool)


def _literal_secret(path: KeyPath, written_to: str) -> ConfigError:
    name = next(str(k) for k in reversed(path) if isinstance(k, str))
    key = _dotted(path)
    return ConfigError(
        f"{key} is given as a literal value, which {written_to}: pass it from the environment "
        f"instead, e.g. {key}='${{oc.env:{'_'.join(_words(name)).upper()}}}'"
    )


def _secret_leaves(
    value: Any, path: KeyPath = (), named: bool = False
) -> Iterator[tuple[KeyPath, Any]]:
    """(path, value) of each value under a key that says secret; list items go by the list's key,
    and everything inside a secret-named mapping counts as secret too."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _secret_leaves(v, (*path, k), named or says_secret(str(k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _secret_leaves(v, (*path, i), named)
    elif named:
        yield path, value


def _select(config: DictConfig | ListConfig, path: KeyPath) -> Any:
    """The value at `path`, resolved (only it and what it refers to)."""
    node: Any = config
    for key in path:
        node = node[key]
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def _at(tree: Any, path: KeyPath) -> Any:
    for key in path:
        try:
            tree = tree[key]
        except (KeyError, IndexError, TypeError):
            return None
    return tree


def typed_overrides(config: DictConfig) -> list[str]:
    """The command line's overrides as typed. Hydra keeps them as strings in the config, where
    OmegaConf reads `x=${oc.env:K}` as an interpolation: iterating would resolve the secret."""
    task = OmegaConf.select(config, "hydra.overrides.task", default=None)
    if task is None:
        return []
    return [str(o) for o in OmegaConf.to_container(task, resolve=False)]  # type: ignore[union-attr]


def refuse_literal_secrets(config: DictConfig) -> None:
    """ConfigError for the first key that says secret and is not read from the environment.

    For Hydra's on_run_start / on_multirun_start, before `.hydra/` is written; `config` includes
    `hydra` (so `hydra.job.env_set.WANDB_API_KEY=...` is checked too).
    """
    overrides = typed_overrides(config)
    _refuse_literal_sweeps(overrides)
    raw = OmegaConf.to_container(config, resolve=False, enum_to_str=True)
    leaves = [(path, value) for path, value in _secret_leaves(raw) if not _harmless(value)]
    if not leaves:
        return  # the usual case: the marked copy below costs more than everything else here
    marks = _EnvMarks()
    marked = OmegaConf.create(marks.mark(raw))
    for path, value in leaves:
        if isinstance(value, str) and "${" in value:
            try:
                value = _select(marked, path)
            except (OmegaConfBaseException, ValueError):
                # It needs what exists only once the job runs (`${hydra:runtime...}`):
                # `redacted_container` checks the key again then, before volt writes anything.
                continue
        if not marks.found_in(value) and not _harmless(value):
            raise _literal_secret(path, _where_hydra_writes(path, overrides))


def _where_hydra_writes(path: KeyPath, overrides: list[str]) -> str:
    dotted = _dotted(path)
    for override in overrides:
        key, _, value = override.partition("=")
        key = key.lstrip("+~")
        inside = dotted.startswith((f"{key}.", f"{key}[")) and value.lstrip()[:1] in ("{", "[")
        if key == dotted or inside:
            return HYDRA_OVERRIDES
    return HYDRA_CONFIG


def _refuse_literal_sweeps(overrides: list[str]) -> None:
    """A sweep's values (`-m x.api_key=a,b`) are in its overrides, not in the composed config."""
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if not override.is_sweep_override() or not says_secret(key.rsplit(".", 1)[-1]):
            continue
        # As typed: Hydra's own string form escapes `${` (`$\{oc.env\:K\}`).
        swept = override.sweep_iterator() if override.is_discrete_sweep() else iter(())
        values = [v.text if isinstance(v, QuotedString) else str(v) for v in swept]
        if not values or not all(ENV_CALL.search(v) for v in values):
            raise _literal_secret(tuple(key.split(".")), HYDRA_OVERRIDES)


def redacted_container(cfg: DictConfig) -> dict[str, Any]:
    """`cfg` resolved into plain data, with each value read from the environment kept as the text
    that reads it; resolving the result again (with the same environment) gives what `cfg` does.

    Raises ConfigError for a key that says secret and holds a literal, and for a value built from
    the environment in a way that no stored text reproduces.
    """
    marks = _EnvMarks()
    raw = OmegaConf.to_container(cfg, resolve=False)
    real = OmegaConf.to_container(cfg, resolve=True)
    marked = marks.mark(raw)
    # Without an env call the marked copy resolves to `real`: resolving it would only cost time.
    seen = OmegaConf.to_container(OmegaConf.create(marked), resolve=True) if marks.calls else real
    to_check: list[KeyPath] = []
    redacted = _redact(real, seen, raw, marks, (), to_check)
    for path in to_check:
        _store_text_that_resolves_alike(redacted, _at(real, path), _at(raw, path), path)
    for path, value in _secret_leaves(redacted):
        if not _harmless(value) and not (isinstance(value, str) and ENV_CALL.search(value)):
            raise _literal_secret(path, VOLT_RECORDS)
    return redacted


def _redact(
    real: Any, seen: Any, raw: Any, marks: _EnvMarks, path: KeyPath, to_check: list[KeyPath]
) -> Any:
    """`real` where it does not depend on the environment; elsewhere the text that reads it.
    `seen` is the config resolved with the environment's values swapped for marks."""
    if marks.found_in(seen):
        to_check.append(path)
        return marks.unmark(seen)
    if isinstance(real, Mapping) and isinstance(seen, Mapping) and real.keys() == seen.keys():
        return {k: _redact(real[k], seen[k], raw, marks, (*path, k), to_check) for k in real}
    if isinstance(real, list) and isinstance(seen, list) and len(real) == len(seen):
        return [
            _redact(r, s, raw, marks, (*path, i), to_check)
            for i, (r, s) in enumerate(zip(real, seen, strict=True))
        ]
    written = _at(raw, path)
    if isinstance(written, str) and ENV_CALL.search(written):
        to_check.append(path)  # a resolver made the mark into something else (e.g. a number)
        return None
    # Not from the environment (if it differs, for another reason: `${now:...}` read twice). A
    # literal `${` is escaped, or whoever loads the file (DDP ranks, eval) would resolve it.
    return real.replace("${", "\\${") if isinstance(real, str) else real


def _store_text_that_resolves_alike(
    redacted: dict[str, Any], wanted: Any, written: Any, path: KeyPath
) -> None:
    """Keep the marks' text at `path` if it resolves to `wanted`. Otherwise (`${oc.decode:...}`
    made the environment's string a number) that text decoded, or else the key's own text as
    written in the config. The first two are the forms eval accepts from a checkpoint
    (volt.config.targets): nothing but environment reads."""
    parent: Any = _at(redacted, path[:-1])
    marks_text = parent[path[-1]]
    decoded = f"${{oc.decode:{marks_text}}}" if isinstance(marks_text, str) else None
    for text in (marks_text, decoded, written):
        # `${hydra:...}` would not resolve where the text is read again (DDP ranks, eval).
        if isinstance(text, str) and "${" in text and "${hydra:" not in text:
            parent[path[-1]] = text
            if _resolves_to(redacted, path, wanted):
                return
    raise ConfigError(
        f"{_dotted(path)} is built from an environment variable in a way whose text does not give "
        "the same value when read again: read the variable directly, e.g. '${oc.env:NAME}' or "
        "'${oc.decode:${oc.env:NAME}}'"
    )


def _resolves_to(redacted: dict[str, Any], path: KeyPath, wanted: Any) -> bool:
    try:
        value = _select(OmegaConf.create(redacted), path)
    except OmegaConfBaseException:
        return False
    return type(value) is type(wanted) and value == wanted
