"""Settings problems in words: which rule a value broke, where the value came from.

Every message is built from the error's type and the field's constraints, never from the
input: a bad value may be a secret. :func:`report` gives the one text of a ``ConfigError``::

    invalid ai_lease settings:
      environment AI_LEASE_LEASE__TTL: lease.ttl: must be at most 86400 (allowed: 0 < x <= 86400)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, get_args, get_origin

if TYPE_CHECKING:  # pydantic at run time only where a model is looked into: a look needs none
    from pydantic import BaseModel
    from pydantic_core import ErrorDetails

Loc = tuple[str | int, ...]
"""A dotted settings location as a tuple: ``("lease", "ttl")``."""
Origins = Mapping[Loc, str]
"""Where each given value came from: ``{("lease", "ttl"): "environment AI_LEASE_LEASE__TTL"}``."""


_RULES = {
    "extra_forbidden": "unknown key",
    "missing": "is required",
    "greater_than": "must be greater than {gt}",
    "greater_than_equal": "must be at least {ge}",
    "less_than_equal": "must be at most {le}",
    "finite_number": "must be a finite number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "string_type": "must be a string",
    "string_too_short": "must not be empty",
    "model_type": "must be a table",
    "dict_type": "must be a table",
    "enum": "must be one of {expected}",
    "literal_error": "must be one of {expected}",
}


def rule(err: ErrorDetails) -> str:
    """The rule an error broke, in words; built from its type, never from its input."""
    ctx = err.get("ctx", {})
    if err["type"] == "value_error":
        return str(ctx["error"])
    template = _RULES.get(err["type"])
    if template is None:
        return err["msg"]
    words = {k: f"{v:g}" if isinstance(v, float) else str(v) for k, v in ctx.items()}
    if "expected" in words:  # "'expire', 'release' or 'alert'" -> "expire, release, alert"
        words["expected"] = words["expected"].replace("'", "").replace(" or ", ", ")
    return template.format(**words)


_NUMBER_ERRORS = {
    "greater_than",
    "greater_than_equal",
    "less_than_equal",
    "finite_number",
    "float_parsing",
    "float_type",
    "int_parsing",
    "int_type",
    "int_from_float",
}


def allowed(err: ErrorDetails, model: type[BaseModel]) -> str:
    """For a number out of range: the range ``model``'s field allows, e.g.
    " (allowed: 0 < x <= 86400)"."""
    if err["type"] not in _NUMBER_ERRORS:
        return ""
    low = high = ""
    for rule in _constraints(model, err["loc"]):
        for name, sign in (("gt", "<"), ("ge", "<=")):
            if (bound := getattr(rule, name, None)) is not None:
                low = f"{_number(bound)} {sign} "
        if (bound := getattr(rule, "le", None)) is not None:
            high = f" <= {_number(bound)}"
    return f" (allowed: {low}x{high})" if low or high else ""


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _constraints(model: type[BaseModel], loc: Loc) -> list[Any]:
    """The annotated-types constraints (Gt, Le, ...) of the field at ``loc``, if any."""
    from pydantic import BaseModel

    field = model.model_fields.get(str(loc[0])) if loc else None
    if field is None:
        return []
    kind, rest = field.annotation, loc[1:]
    if get_origin(kind) is dict:
        kind, rest = get_args(kind)[1], rest[1:]
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return _constraints(kind, rest)
    found = list(field.metadata)
    for arg in get_args(kind):  # Annotated[int, Field(...)] | None keeps them on the arg
        found += getattr(arg, "__metadata__", ())
        found += [m for f in getattr(arg, "__metadata__", ()) for m in getattr(f, "metadata", ())]
    return found


def where(origins: Origins | None, loc: Loc) -> str:
    """Where the value at ``loc`` came from ("" when nobody said, "default value" if unset)."""
    if origins is None:
        return ""
    hits = (where for key, where in origins.items() if overlaps(key, loc))
    return next(hits, "default value")


def overlaps(a: Loc, b: Loc) -> bool:
    """Whether one location contains the other (``lease`` and ``lease.ttl`` do)."""
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def report(problems: Iterable[tuple[str, Loc, str]]) -> str:
    """The text of a ``ConfigError``: one line per (where, location, rule)."""
    lines = []
    for where, loc, rule in problems:
        field = ".".join(map(str, loc)) or "settings"
        lines.append(f"  {where}: {field}: {rule}" if where else f"  {field}: {rule}")
    return "invalid ai_lease settings:\n" + "\n".join(lines)
