"""Where settings come from: a TOML file, ``AI_LEASE_*`` variables, arguments.

Each source becomes a list of leaf :data:`Entry` s (location, value, where it came from);
:func:`merge` nests them, later sources winning, and keeps each value's origin for the
error messages. Nothing here validates a value: ``Settings`` does.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args, get_origin

from ai_lease.errors import ConfigError
from ai_lease.settings_errors import Loc, overlaps, report

if TYPE_CHECKING:  # pydantic at run time only in env_entries: a look (ls, status) needs none
    from pydantic import BaseModel

ENV_PREFIX = "AI_LEASE_"
ENV_DELIMITER = "__"
CONFIG_ENV_VAR = "AI_LEASE_CONFIG"
DEFAULT_CONFIG_PATH = Path("config/ai-lease.toml")

Entry = tuple[Loc, Any, str]
"""One leaf value: its dotted location, the value, where it came from."""


def our_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``AI_LEASE_*`` variables of ``environ``, their names upper-cased."""
    # Names match case-insensitively, as pydantic-settings does by default.
    return {k.upper(): v for k, v in environ.items() if k.upper().startswith(ENV_PREFIX)}


def config_file(config_path: str | Path | None, from_env: str | None) -> Path | None:
    """The settings file to read: the one given, else the one the environment names, else
    ``config/ai-lease.toml`` if it exists (None: no file)."""
    if config_path is not None:
        return _existing(Path(config_path), "given as the config path")
    if from_env:
        return _existing(Path(from_env), f"named by {CONFIG_ENV_VAR}")
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None


def _existing(path: Path, how: str) -> Path:
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} ({how}) does not exist or is not a file")
    return path


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML file at ``path`` as a dict; a problem is a ``ConfigError`` naming the file."""
    # Errors are raised "from None": the file's text may hold secrets.
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except tomllib.TOMLDecodeError as exc:  # its message carries "(at line L, column C)"
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8"
        raise ConfigError(f"config file {str(path)!r} cannot be read: {why}") from None


_UNKNOWN_VARIABLE = "unknown key (each variable names one field, e.g. AI_LEASE_LEASE__TTL)"


def env_entries(variables: Mapping[str, str], model: type[BaseModel]) -> list[Entry]:
    """One entry per variable; a variable naming no field of ``model`` is a ``ConfigError``."""
    entries: list[Entry] = []
    unknown: list[tuple[str, Loc, str]] = []
    for name, value in sorted(variables.items()):
        loc: Loc = tuple(name[len(ENV_PREFIX) :].lower().split(ENV_DELIMITER))
        if _names_a_field(model, loc):
            entries.append((loc, value, f"environment {name}"))
        else:
            unknown.append((f"environment {name}", loc, _UNKNOWN_VARIABLE))
    if unknown:
        raise ConfigError(report(unknown))
    return entries


def _names_a_field(model: type[BaseModel], loc: Loc) -> bool:
    """Whether ``loc`` ends at one field of ``model``; a dict field's keys are free names."""
    from pydantic import BaseModel

    field = model.model_fields.get(str(loc[0]))
    if field is None:
        return False
    kind, rest = field.annotation, loc[1:]
    if get_origin(kind) is dict:  # skip the free key: stages.<name>.deadline
        kind, rest = get_args(kind)[1], rest[1:]
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return bool(rest) and _names_a_field(kind, rest)
    return not rest


def leaves(tree: Mapping[str, Any], prefix: Loc, where: str) -> list[Entry]:
    """One entry per leaf of ``tree`` (an empty table is a leaf), located under ``prefix``."""
    entries: list[Entry] = []
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            entries += leaves(value, (*prefix, key), where)
        else:
            entries.append(((*prefix, key), value, where))
    return entries


def merge(entries: Iterable[Entry]) -> tuple[dict[str, Any], dict[Loc, str]]:
    """Nest ``entries`` (lowest precedence first); a later value replaces any it overlaps."""
    flat: dict[Loc, Any] = {}
    origins: dict[Loc, str] = {}
    for loc, value, where in entries:
        for old in [key for key in flat if overlaps(key, loc)]:
            del flat[old], origins[old]
        flat[loc], origins[loc] = value, where
    tree: dict[str, Any] = {}
    for loc, value in flat.items():
        node = tree
        for key in loc[:-1]:
            node = node.setdefault(str(key), {})
        node[str(loc[-1])] = value
    return tree, origins
