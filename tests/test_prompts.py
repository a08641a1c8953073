"""Prompt templates: strict variables, helpful lookups, and a sandbox that keeps secrets in."""

from __future__ import annotations

from pathlib import Path

import pytest

from ai_lease.errors import JobSpecError
from ai_lease.prompts import SHIPPED_PROMPTS, PromptLibrary

CANARY = "canary-7f3a9c-do-not-leak"

ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.environ }}",
    "{{ joiner.__init__.__globals__.os.environ }}",
    "{{ lipsum.__globals__['os'].environ }}",
    "{{ text.__class__.__base__.__subclasses__() }}",
    "{{ text | attr('__class__') }}",
    "{{ '{0.__class__.__init__.__globals__}'.format(text) }}",
    "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{{ c }}{% endfor %}",
]


@pytest.fixture
def canary(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AI_LEASE_TEST_SECRET", CANARY)
    return CANARY


def test_missing_variable_names_it() -> None:
    """Rendering without a variable the template uses raises JobSpecError naming it."""
    with pytest.raises(JobSpecError, match="'topic'"):
        PromptLibrary().render_text("Write about {{ topic }}.", {})


def test_missing_variable_in_a_shipped_template_names_it() -> None:
    """A shipped template rendered without 'input' names the missing variable."""
    with pytest.raises(JobSpecError, match="'input'") as info:
        PromptLibrary().render("summarize", {})
    assert "summarize" in str(info.value)


def test_unknown_template_lists_the_known_ones() -> None:
    """Asking for a template that does not exist names it and lists what can be found."""
    with pytest.raises(JobSpecError) as info:
        PromptLibrary().render("no_such_prompt", {"input": "x"})
    message = str(info.value)
    assert "'no_such_prompt'" in message
    assert "summarize" in message and "extract_json" in message


def test_templates_in_given_folders_are_found_first(tmp_path: Path) -> None:
    """A folder passed in is searched before the shipped prompts, and its names are listed."""
    (tmp_path / "summarize.j2").write_text("mine: {{ input }}")
    (tmp_path / "custom.j2").write_text("custom {{ input }}")
    library = PromptLibrary([tmp_path])
    assert library.render("summarize", {"input": "x"}) == "mine: x"
    assert {"custom", "summarize", "extract_json"} <= set(library.names())


def test_template_syntax_error_is_a_job_spec_error(tmp_path: Path) -> None:
    """A broken template raises JobSpecError naming the template and line."""
    (tmp_path / "broken.j2").write_text("line one\n{{ oops\n")
    with pytest.raises(JobSpecError, match="'broken', line"):
        PromptLibrary([tmp_path]).render("broken", {})
    with pytest.raises(JobSpecError, match="inline prompt"):
        PromptLibrary().render_text("{% if %}", {})


@pytest.mark.parametrize("payload", ESCAPES)
def test_sandbox_refuses_attribute_walks(payload: str, canary: str) -> None:
    """Walks into Python internals are refused with a JobSpecError that leaks nothing."""
    with pytest.raises(JobSpecError) as info:
        PromptLibrary().render_text(payload, {"text": "hello"})
    assert canary not in str(info.value)
    assert canary not in repr(info.value.__cause__) + repr(info.value.__context__)


@pytest.mark.parametrize(
    "payload",
    [
        "{{ environ }}",
        "{{ self }}",
        "{{ range }}{{ dict }}{{ namespace }}",
        "{{ text|pprint }}",
        "{% for k, v in namespace().__dict__.items() %}{{ k }}{% endfor %}",
    ],
)
def test_no_template_output_or_error_contains_the_environment(payload: str, canary: str) -> None:
    """Whatever a template renders or fails with, the environment's secrets are not in it."""
    try:
        out = PromptLibrary().render_text(payload, {"text": "hello"})
    except JobSpecError as exc:
        out = f"{exc} {exc.__cause__!r} {exc.__context__!r}"
    assert canary not in out


@pytest.mark.parametrize(
    "source",
    [
        "{% for i in range(10**9) %}x{% endfor %}",
        "{% include 'no_such_partial.j2' %}",
        "{{ 1 / 0 }}",
        "{{ text + 1 }}",
    ],
    ids=["huge-range", "missing-include", "zero-division", "type-error"],
)
def test_template_failing_at_render_time_is_a_job_spec_error(source: str) -> None:
    """A template that fails while rendering (the sandbox's range limit included) raises
    JobSpecError, the error the runner treats as bad input rather than retrying."""
    with pytest.raises(JobSpecError):
        PromptLibrary().render_text(source, {"text": "hello"})


def test_shipped_summarize_renders() -> None:
    """The shipped summarize template wraps the input in <input> lines."""
    text = PromptLibrary().render("summarize", {"input": "The cat sat.", "sentences": 2})
    assert "in 2 sentences" in text
    assert text.endswith("<input>\nThe cat sat.\n</input>")


def test_shipped_summarize_defaults_its_sentence_count() -> None:
    """Without 'sentences' the summarize template asks for three."""
    assert "in 3 sentences" in PromptLibrary().render("summarize", {"input": "x"})


def test_shipped_extract_json_renders() -> None:
    """The shipped extract_json template lists the fields and wraps the input."""
    text = PromptLibrary().render(
        "extract_json", {"input": "Ada, 36, London", "fields": ["name", "age", "city"]}
    )
    assert "name, age, city" in text
    assert text.endswith("<input>\nAda, 36, London\n</input>")


def test_shipped_prompts_folder_holds_the_templates() -> None:
    """The shipped prompts/ folder exists and holds summarize and extract_json."""
    assert {p.stem for p in SHIPPED_PROMPTS.glob("*.j2")} >= {"summarize", "extract_json"}


def test_inline_render() -> None:
    """render_text renders an inline template with the given variables."""
    assert PromptLibrary().render_text("Summarise: {{ text }}", {"text": "hi"}) == "Summarise: hi"


@pytest.mark.parametrize(
    ("source", "plain"),
    [
        ("{{ input }}", True),
        ("Summarise {{ doc.title }} by {{ doc['author'] }}.", True),
        ("no variables at all", True),
        ("{% for i in range(9) %}{{ i }}{% endfor %}", False),
        ("{{ input | upper }}", False),
        ("{{ input * 3 }}", False),
        ("{{ lipsum() }}", False),
        ("{{ doc[key] }}", False),
        ("{{ unclosed", False),
    ],
)
def test_only_text_and_lookups_count_as_plain(source: str, plain: bool) -> None:
    """A plain inline template (rendered on the loop) has no statement, filter, call or
    operator: nothing in it can run long; anything else renders in a thread."""
    assert PromptLibrary().is_plain(source) is plain
