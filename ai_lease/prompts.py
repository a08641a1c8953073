"""Prompt templates, rendered in a sandbox.

Templates are Jinja2 files (``<name>.j2``) looked up in the given folders (the CLI gives
``--prompts DIR`` and the ``prompts/`` beside the job file), then in ``./prompts`` and the
prompts shipped inside the package (``ai_lease/data/prompts``). Rendering uses Jinja's
``SandboxedEnvironment`` (no attribute walks into Python internals, no environment access)
with ``StrictUndefined`` (a missing variable is an error naming it), under bounds: a
render deadline (``render_timeout``, checked on every template line), an output limit
(``max_output_chars``), and no arithmetic whose result alone would be huge
(``10**(10**8)``, ``"x" * 10**9``).

>>> PromptLibrary().render_text("Summarise: {{ text }}", {"text": "hi"})
'Summarise: hi'
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import SandboxedEnvironment

from ai_lease.errors import JobSpecError

__all__ = ["DEFAULT_MAX_PROMPT_CHARS", "SHIPPED_PROMPTS", "PromptLibrary"]

SHIPPED_PROMPTS = Path(__file__).resolve().parent / "data" / "prompts"
DEFAULT_MAX_PROMPT_CHARS = 32 * 2**20
DEFAULT_RENDER_TIMEOUT_S = 5.0
_COMPILED_LIMIT = 256  # inline templates kept compiled (oldest dropped first)
_MAX_INT_BITS = 4096  # no template needs numbers past ~1e1233


class _TooBig(Exception):
    """A bound of the render was crossed (the message says which)."""


class _BoundedSandbox(SandboxedEnvironment):
    """The sandbox, refusing arithmetic whose result alone would exhaust the process."""

    intercepted_binops = frozenset({"**", "*", "%"})
    max_chars = DEFAULT_MAX_PROMPT_CHARS

    def call_binop(
        self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any
    ) -> Any:
        if operator == "**" and isinstance(left, int) and isinstance(right, int):
            if right > 0 and abs(left) > 1 and right * abs(left).bit_length() > _MAX_INT_BITS:
                raise _TooBig(f"{operator}: the number would have over {_MAX_INT_BITS} bits")
        elif operator == "*":
            self._check_product(left, right)
        elif operator == "%" and isinstance(left, str) and ("*" in left or _wide(left)):
            raise _TooBig("%-formatting with a computed or very large width")
        return super().call_binop(context, operator, left, right)

    def _check_product(self, left: Any, right: Any) -> None:
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and isinstance(count, int):
                if len(seq) * count > self.max_chars:
                    raise _TooBig(f"*: a sequence of {len(seq) * count} items")
        if isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                raise _TooBig(f"*: the number would have over {_MAX_INT_BITS} bits")


def _wide(fmt: str) -> bool:
    """Whether a %-format names a width or precision of 5 digits or more."""
    digits = 0
    for char in fmt:
        digits = digits + 1 if char.isdigit() else 0
        if digits >= 5:
            return True
    return False


class _Deadline:
    """A trace function, set in the rendering thread only, that stops the render at
    ``deadline`` (monotonic): checked on every line the template's own code runs, so a
    loop that calls nothing and writes nothing is stopped too."""

    def __init__(self, env: jinja2.Environment, deadline: float) -> None:
        self.env, self.deadline = env, deadline

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_globals.get("environment") is self.env:
            return self._line
        return None

    def _line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if time.monotonic() > self.deadline:
            raise _TooBig("it ran past job.render_timeout")
        return self._line


def _plain_output(node: nodes.Node) -> bool:
    """An output of text and variable lookups only (see :meth:`PromptLibrary.is_plain`)."""
    return isinstance(node, nodes.Output) and all(_plain_expr(n) for n in node.nodes)


def _plain_expr(node: nodes.Node) -> bool:
    if isinstance(node, nodes.TemplateData | nodes.Name):
        return True
    if isinstance(node, nodes.Getattr):
        return _plain_expr(node.node)
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and _plain_expr(node.node)
    return False


class PromptLibrary:
    """Finds and renders templates; every failure is a :class:`JobSpecError` naming it.

    ``render_timeout`` (seconds) and ``max_output_chars`` bound one rendering.
    """

    def __init__(
        self,
        folders: Sequence[str | Path] = (),
        *,
        render_timeout: float = DEFAULT_RENDER_TIMEOUT_S,
        max_output_chars: int = DEFAULT_MAX_PROMPT_CHARS,
    ) -> None:
        self.folders = [Path(f) for f in folders] + [Path("prompts"), SHIPPED_PROMPTS]
        self.render_timeout, self.max_output_chars = render_timeout, max_output_chars
        self._env = _BoundedSandbox(
            loader=jinja2.FileSystemLoader([str(f) for f in self.folders]),
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            keep_trailing_newline=False,
        )
        self._env.max_chars = max_output_chars
        self._compiled: dict[str, jinja2.Template] = {}
        self._plain: dict[str, bool] = {}  # inline source -> only text and variable lookups

    def names(self) -> list[str]:
        """Every template name that can be found (without the ``.j2`` suffix)."""
        found = {p.stem for f in self.folders if f.is_dir() for p in f.glob("*.j2")}
        return sorted(found)

    def render(self, name: str, variables: Mapping[str, Any]) -> str:
        """Render template ``name`` (``prompts/<name>.j2``) with ``variables``."""
        try:
            template = self._env.get_template(f"{name}.j2")
        except jinja2.TemplateNotFound:
            known = ", ".join(self.names()) or "none"
            raise JobSpecError(f"prompt template {name!r} not found (known: {known})") from None
        except jinja2.TemplateSyntaxError as exc:
            raise JobSpecError(
                f"prompt template {name!r}, line {exc.lineno}: {exc.message}"
            ) from None
        return self._render(template, variables, f"prompt template {name!r}")

    def render_text(self, source: str, variables: Mapping[str, Any]) -> str:
        """Render an inline template (compiled once per distinct text: compiling costs
        ~0.3 ms, more than a whole job's lease operations)."""
        template = self._compiled.get(source)
        if template is None:
            try:
                template = self._env.from_string(source)
            except jinja2.TemplateSyntaxError as exc:
                raise JobSpecError(f"inline prompt, line {exc.lineno}: {exc.message}") from None
            if len(self._compiled) >= _COMPILED_LIMIT:
                self._compiled.pop(next(iter(self._compiled)))
            self._compiled[source] = template
        return self._render(template, variables, "inline prompt")

    def is_plain(self, source: str) -> bool:
        """Whether the inline template ``source`` is only text and plain variable lookups
        (``{{ input }}``, ``{{ doc.title }}``): no statement, filter, call or operator, so
        rendering it costs no more than copying its variables. Such a template can render
        on the event loop; any other may loop until the render deadline and renders in a
        thread. A template that does not parse is not plain (rendering it says why)."""
        plain = self._plain.get(source)
        if plain is None:
            try:
                body = self._env.parse(source).body
            except jinja2.TemplateSyntaxError:
                body = None
            plain = body is not None and all(_plain_output(node) for node in body)
            if len(self._plain) >= _COMPILED_LIMIT:
                self._plain.pop(next(iter(self._plain)))
            self._plain[source] = plain
        return plain

    def _render(self, template: jinja2.Template, variables: Mapping[str, Any], what: str) -> str:
        try:
            return self._bounded(template, variables)
        except _TooBig as exc:
            raise JobSpecError(f"{what}: refused, {exc}") from None
        except jinja2.UndefinedError as exc:
            if exc.message == "'input' is undefined":
                raise JobSpecError(
                    f"{what} uses 'input' but the job has none "
                    "(give input or input_file, or --input / --input-file)"
                ) from None
            raise JobSpecError(f"{what}: {exc.message} (pass it in the job's variables)") from None
        except jinja2.exceptions.SecurityError as exc:
            raise JobSpecError(f"{what}: refused by the sandbox: {exc}") from None
        except (jinja2.TemplateError, ArithmeticError, LookupError, TypeError, ValueError) as exc:
            raise JobSpecError(f"{what}: {type(exc).__name__}: {exc}") from None

    def _bounded(self, template: jinja2.Template, variables: Mapping[str, Any]) -> str:
        """Render under the deadline and the output limit (in the calling thread)."""
        limit, size, parts = self.max_output_chars, 0, []
        previous = sys.gettrace()
        sys.settrace(_Deadline(self._env, time.monotonic() + self.render_timeout))
        try:
            for part in template.generate(**variables):
                size += len(part)
                if size > limit:
                    raise _TooBig(f"the prompt grew past job.max_prompt_chars ({limit})")
                parts.append(part)
        finally:
            sys.settrace(previous)
        return "".join(parts)
