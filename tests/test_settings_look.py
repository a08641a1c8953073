"""A look's settings (`ls`, `status`) read without pydantic give what the whole settings give.

Each case is read both ways from the same sources (environment, TOML file, arguments,
defaults): :func:`quick_look` either answers exactly what ``load_settings`` would hold, or
hands over (None); through the CLI's :class:`Context`, a bad value gives the one error
``load_settings`` gives.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from ai_lease.cli.context import Context
from ai_lease.errors import ConfigError
from ai_lease.settings import Settings, load_settings
from ai_lease.settings_look import LookSettings, quick_look
from ai_lease.timeouts import LeaseTimings, StreamTimeouts

# Values for each field the look reads: good ones, bad ones, and ones only pydantic reads.
VALUES: dict[tuple[str, str], list[Any]] = {
    ("store", "url"): [
        "sqlite:///x.db",
        "SQLITE:///up.db",
        "redis://:secret@host:6379/0",
        "postgresql://u:pw@db/x",
        "http://nope",
        "nope",
        "",
        5,
    ],
    ("store", "namespace"): ["team", "", 7, "ns\udcff"],
    ("store", "op_timeout"): [2, 1.5, "0.5", "3", 0, -1, "1e0", " 2", "nan", 86_401, True, 4.9],
    ("store", "poll_interval"): [1, "0.25", 86_400, 86_400.5, "x", float("inf")],
    ("lease", "ttl"): [30, "60", 10, 7, "inf", 0.0],
    ("lease", "renew_interval"): [5, "4", 2.5, 20, "10", 1.9],
    ("lease", "phi_threshold"): [8, "6", 10, "10.0", 5.9, 11, "8e0"],
}


def _env_name(loc: tuple[str, str]) -> str:
    return "AI_LEASE_" + "__".join(loc).upper()


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value != value:
        return "nan"
    if value == float("inf"):
        return "inf"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def _write_toml(path: Path, given: dict[tuple[str, str], Any]) -> Path:
    sections: dict[str, list[str]] = {}
    for (section, name), value in given.items():
        sections.setdefault(section, []).append(f"{name} = {_toml_value(value)}")
    text = "".join(f"[{s}]\n" + "\n".join(lines) + "\n" for s, lines in sections.items())
    path.write_text(text, encoding="utf-8")
    return path


def _both(config: Path | None, env: dict[str, str], **overrides: Any) -> tuple[Any, Any]:
    """(quick answer or None, the whole settings' LookSettings or the ConfigError's text)."""
    quick = quick_look(config, env=env, **overrides)
    try:
        full: Any = LookSettings.of(load_settings(config, env=env, **overrides))
    except ConfigError as exc:
        full = str(exc)
    return quick, full


def _agree(quick: LookSettings | None, full: Any) -> None:
    if quick is not None:
        assert full == quick, f"quick path answered {quick}, the settings say {full}"


def test_the_defaults_are_the_settings_defaults(tmp_path: Path, monkeypatch: Any) -> None:
    """With nothing set, both paths give the defaults, and the quick one answers."""
    monkeypatch.chdir(tmp_path)
    quick, full = _both(None, {})
    assert quick == full == LookSettings()
    # The rules the quick path checks, at the defaults, are the whole settings' ones.
    assert Settings().lease_timings() == LeaseTimings()
    assert Settings().stream_timeouts() == StreamTimeouts()


def test_each_value_alone_agrees_from_env_toml_and_arguments(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Every value of every field, from each source alone: the same answer or a hand-over."""
    monkeypatch.chdir(tmp_path)
    answered = 0
    for loc, values in VALUES.items():
        for value in values:
            if not isinstance(value, str) or "\udcff" not in value:  # arguments only
                toml = _write_toml(tmp_path / "one.toml", {loc: value})
                _agree(*_both(toml, {}))
                text = value if isinstance(value, str) else _toml_value(value)
                quick, full = _both(None, {_env_name(loc): text})
                _agree(quick, full)
                answered += quick is not None
            _agree(*_both(None, {}, **{loc[0]: {loc[1]: value}}))
    assert answered > 20  # the quick path does answer the plain cases


def test_mixed_sources_agree(tmp_path: Path, monkeypatch: Any) -> None:
    """Random mixes over the file, the environment and arguments (later wins) agree."""
    monkeypatch.chdir(tmp_path)
    rng = random.Random(28)
    locs = list(VALUES)
    for n in range(300):
        in_file = {loc: rng.choice(VALUES[loc]) for loc in rng.sample(locs, rng.randint(0, 4))}
        in_file = {loc: v for loc, v in in_file.items() if v != "ns\udcff"}
        in_env = {
            _env_name(loc): rng.choice([v for v in VALUES[loc] if isinstance(v, str)][:-1] or ["1"])
            for loc in rng.sample(locs, rng.randint(0, 3))
        }
        toml = _write_toml(tmp_path / f"mix{n}.toml", in_file) if in_file else None
        _agree(*_both(toml, in_env))


def test_the_default_file_and_the_named_file_are_read(tmp_path: Path, monkeypatch: Any) -> None:
    """config/ai-lease.toml in the cwd, and the file $AI_LEASE_CONFIG names, count."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config").mkdir()
    _write_toml(tmp_path / "config" / "ai-lease.toml", {("store", "namespace"): "fromfile"})
    quick, full = _both(None, {})
    assert quick == full and quick is not None and quick.namespace == "fromfile"
    named = _write_toml(tmp_path / "named.toml", {("lease", "renew_interval"): 4})
    quick, full = _both(None, {"AI_LEASE_CONFIG": str(named)})
    assert quick == full and quick is not None and quick.renew_interval == 4.0
    assert quick.namespace == "ai_lease"  # the named file, not the default one


@pytest.mark.parametrize(
    "given",
    [
        {("stream", "idle"): 5},
        {("provider", "api_key"): "sk-test-123456789"},
        {("stages", "call_ai"): {"deadline": 5}},
        {("lease", "stall_policy"): "release"},
    ],
)
def test_any_other_field_hands_over(tmp_path: Path, monkeypatch: Any, given: Any) -> None:
    """A value outside the look's fields is the whole settings' to read (None)."""
    monkeypatch.chdir(tmp_path)
    assert quick_look(_write_toml(tmp_path / "other.toml", given), env={}) is None
    ((loc, value),) = given.items()
    if not isinstance(value, dict):
        assert quick_look(None, env={_env_name(loc): str(value)}) is None
    assert quick_look(None, env={"AI_LEASE_NO_SUCH": "1"}) is None


def _look_or_error(monkeypatch: Any, env: dict[str, str], config: Path | None, url: str | None):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        return Context(config, url, debug=False).look
    except ConfigError as exc:
        return str(exc)


BAD = [
    ({"AI_LEASE_STORE__URL": "http://x"}, None),
    ({"AI_LEASE_STORE__OP_TIMEOUT": "0"}, None),
    ({"AI_LEASE_STORE__OP_TIMEOUT": "5"}, None),  # not shorter than renew_interval
    ({"AI_LEASE_LEASE__RENEW_INTERVAL": "20"}, None),  # more than half the ttl
    ({"AI_LEASE_LEASE__TTL": "7"}, None),  # first renewal after the self-fence point
    ({"AI_LEASE_LEASE__PHI_THRESHOLD": "11"}, None),
    ({"AI_LEASE_STORE__NAMESPACE": ""}, None),
    ({"AI_LEASE_STORE__POLL_INTERVAL": "abc"}, None),
    ({"AI_LEASE_LEASE__TTLL": "3"}, None),  # unknown variable
    ({"AI_LEASE_STREAM__IDLE": "-1"}, None),  # a section a look does not read
    ({}, "missing.toml"),
    ({}, "bad.toml"),
    ({"AI_LEASE_CONFIG": "nowhere.toml"}, None),
    ({}, "x"),  # --store x
]


@pytest.mark.parametrize(("env", "extra"), BAD)
def test_a_bad_setting_is_the_same_error_through_the_cli(
    tmp_path: Path, monkeypatch: Any, env: dict[str, str], extra: str | None
) -> None:
    """Through the CLI's Context, a bad setting raises load_settings' very message."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.toml").write_text("[store\nurl = 1", encoding="utf-8")
    config = tmp_path / extra if extra and extra.endswith(".toml") else None
    url = extra if extra == "x" else None
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as expected:
        load_settings(config, **({"store": {"url": url}} if url else {}))
    assert _look_or_error(monkeypatch, {}, config, url) == str(expected.value)


def test_the_cli_look_matches_the_settings_over_every_pair(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Each pair of values (environment) through Context.look: the settings' answer or error."""
    monkeypatch.chdir(tmp_path)
    picks = {
        loc: [v for v in values if isinstance(v, str) and "\udcff" not in v][:3] or ["1"]
        for loc, values in VALUES.items()
    }
    for a, b in itertools.combinations(picks, 2):
        for va, vb in itertools.product(picks[a], picks[b]):
            env = {_env_name(a): va, _env_name(b): vb}
            with monkeypatch.context() as patched:
                got = _look_or_error(patched, env, None, None)
                try:
                    want: Any = LookSettings.of(load_settings(None))
                except ConfigError as exc:
                    want = str(exc)
            assert got == want, env


def test_a_look_masks_the_store_password(tmp_path: Path, monkeypatch: Any) -> None:
    """The quick path registers the store URL's password, as the whole settings do."""
    from ai_lease.redaction import redact

    monkeypatch.chdir(tmp_path)
    look = Context(None, "redis://:hunter2secret@host:6379/0", debug=False).look
    assert look.url.endswith("@host:6379/0")
    assert "hunter2secret" not in redact("boom redis://:hunter2secret@host:6379/0 hunter2secret")
