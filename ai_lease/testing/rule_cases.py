"""The lease rules as one table of cases: a starting state, one operation, what it answers.

Each :class:`RuleCase` names a starting :class:`State` (reached by real operations, listed
as its steps), one operation (a :class:`Step`: acquire, renew, release, commit, fail,
cancel, report_stall, submit or retry, by an owner, with its arguments), the answer it
gives and the key facts of the record afterwards (:class:`After`). The same table runs
against the pure rules (``ai_lease.lease.rules``) and against every store through its public
protocol (:mod:`ai_lease.testing.rule_cases_run`), so the three copies of the rules (Python,
Lua, plpgsql) are held to one statement of them. A new rule is one new row of
:data:`CASES`.

``python -m ai_lease.testing.rule_cases`` prints the table as Markdown (``docs/rules.md``);
with a path it writes the file there instead.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BUDGET",
    "CASES",
    "LONG",
    "OWNERS",
    "SHORT_TTL",
    "STATES",
    "WAIT",
    "After",
    "RuleCase",
    "State",
    "Step",
    "case",
    "markdown",
    "step",
]

OWNERS = {"A": "node-a#1.aaaa", "B": "node-b#1.bbbb", "A2": "node-a#2.cccc"}
"""The owners a case names: A and B on two nodes, A2 a second process on A's node."""

SHORT_TTL = 0.2
"""The lease of a state that must lapse (seconds)."""

BUDGET = 0.2
"""The stage budget of a renewal that must find progress too old (seconds)."""

WAIT = 1.5
"""How long a "later" state waits before its operation: a real wait on a store, whose clock
is the server's; far above :data:`SHORT_TTL` and :data:`BUDGET`, so a loaded machine
cannot make a lease seem live that should have lapsed."""

LONG = 30.0
"""The lease and the budget of a state that must stay live through every wait."""


@dataclass(frozen=True, slots=True)
class Step:
    """One operation: its name, the owner alias it is done by (None: not fenced), and its
    arguments as sorted (name, value) pairs (what is not given takes the runner's default)."""

    op: str
    by: str | None = None
    args: tuple[tuple[str, object], ...] = ()

    def arg(self, name: str, default: object) -> object:
        """The argument ``name``, or ``default`` when the step does not give it."""
        return dict(self.args).get(name, default)

    def __str__(self) -> str:
        who = f" by {self.by}" if self.by else ""
        given = ", ".join(f"{name} {value}" for name, value in self.args)
        return f"{self.op}{who}" + (f" ({given})" if given else "")


def step(op: str, by: str | None = None, **args: object) -> Step:
    """A :class:`Step` with its arguments sorted by name."""
    return Step(op, by, tuple(sorted(args.items())))


@dataclass(frozen=True, slots=True)
class State:
    """A starting state: its name, what it is in words, the steps that reach it, and whether
    its operation comes :data:`WAIT` seconds later (a lease lapsed, progress gone stale)."""

    name: str
    title: str
    steps: tuple[Step, ...]
    later: bool = False


@dataclass(frozen=True, slots=True)
class After:
    """The record after the operation: its status (None: no record), its owner's alias
    (None: no owner), whether its token is ``same`` or ``higher`` than before the operation
    (0 standing for no record), its attempts, and a FAILED record's failure kind."""

    status: str | None
    owner: str | None = None
    token: str = "same"
    attempts: int = 0
    kind: str | None = None


@dataclass(frozen=True, slots=True)
class RuleCase:
    """One rule: from ``state``, ``op`` answers ``answer`` and leaves the record ``after``.

    The answers, by operation: acquire ``acquired`` (``takeover: <cause>`` when another
    node held it), ``following``, ``finished <STATUS>`` or ``conflict``; renew ``renewed``
    (``renewed, stalled`` under the alert policy) or ``refused: <Refusal>``; commit and fail
    ``written <STATUS>`` or ``rejected: <Refusal>``; release and report_stall ``done`` or
    ``refused``; cancel, retry and submit ``returns <STATUS>``, ``returns nothing`` or
    ``conflict``."""

    name: str
    state: State
    op: Step
    answer: str
    after: After


def _state(name: str, title: str, *steps: Step, later: bool = False) -> State:
    return State(name, title, steps, later)


_A = step("acquire", "A")
NONE = _state("none", "no record")
PENDING = _state("pending", "PENDING, submitted (fingerprint fp-1), never run",
                 step("submit", spec="{}", fingerprint="fp-1"))  # fmt: skip
RUNNING = _state("running", "RUNNING by A, live lease, fresh progress", _A)
LAPSED = _state("lapsed", "RUNNING by A, lease lapsed",
                step("acquire", "A", ttl=SHORT_TTL), later=True)  # fmt: skip
STALE = _state("stale", "RUNNING by A, live lease, progress older than the budget",
               _A, later=True)  # fmt: skip
STALE_ALERT = _state("stale-alert", "as stale, under the alert stall policy",
                     step("acquire", "A", stall_policy="alert"), later=True)  # fmt: skip
RELEASED = _state("released", "PENDING, released by A after one attempt",
                  _A, step("release", "A", error="boom"))  # fmt: skip
INTERRUPTED = _state("interrupted", "PENDING, released by an interrupted A",
                     _A, step("release", "A", interrupted=True))  # fmt: skip
STALLED = _state("stalled", "PENDING, released by A with a stall snapshot",
                 _A, step("release", "A", snapshot="stuck in call_ai"))  # fmt: skip
TAKEN = _state("taken", "RUNNING by B, taken over from A (A's fence is stale)",
               _A, step("release", "A"), step("acquire", "B"))  # fmt: skip
DONE = _state("done", "DONE, committed by A", _A, step("commit", "A", result="42"))
FAILED = _state("failed", "FAILED by A", _A, step("fail", "A", reason="bad input"))
CANCELLED = _state("cancelled", "CANCELLED while A ran", _A, step("cancel"))
RETRIED = _state("retried", "PENDING again: failed by A, then retried",
                 _A, step("fail", "A", reason="bad input"), step("retry"))  # fmt: skip

STATES = (NONE, PENDING, RUNNING, LAPSED, STALE, STALE_ALERT, RELEASED, INTERRUPTED,
          STALLED, TAKEN, DONE, FAILED, CANCELLED, RETRIED)  # fmt: skip
"""Every starting state the table uses, in the order the documentation lists them."""


def case(
    name: str,
    state: State,
    op: Step,
    answer: str,
    status: str | None,
    owner: str | None = None,
    token: str = "same",
    attempts: int = 0,
    kind: str | None = None,
) -> RuleCase:
    """One row of the table (the record's facts afterwards given flat)."""
    return RuleCase(name, state, op, answer, After(status, owner, token, attempts, kind))


_R, _U, _H = "RUNNING", "same", "higher"
REN = step("renew", "A")
STALE_RENEW = step("renew", "A", max_no_progress=BUDGET)
PROGRESS_RENEW = step("renew", "A", max_no_progress=BUDGET, progress_version=1)
INTERRUPT = step("release", "A", interrupted=True)
GRACE_RENEW = step("renew", "A", max_no_progress=BUDGET, grace=LONG)

# fmt: off
CASES: tuple[RuleCase, ...] = (
    # -- acquire -----------------------------------------------------------------------------
    case("first acquire creates and owns", NONE, _A, "acquired", _R, "A", _H, 1),
    case("a submitted job is acquired", PENDING, _A, "acquired", _R, "A", _H, 1),
    case("same fingerprint acquires", PENDING, step("acquire", "A", fingerprint="fp-1"),
         "acquired", _R, "A", _H, 1),
    case("other fingerprint conflicts", PENDING, step("acquire", "A", fingerprint="fp-2"),
         "conflict", "PENDING", None, _U, 0),
    case("owner's repeat keeps its token", RUNNING, _A, "acquired", _R, "A", _U, 1),
    case("another node follows a live lease", RUNNING, step("acquire", "B"),
         "following", _R, "A", _U, 1),
    case("same node, other process follows", RUNNING, step("acquire", "A2"),
         "following", _R, "A", _U, 1),
    case("stale progress still holds the lease", STALE, step("acquire", "B"),
         "following", _R, "A", _U, 1),
    case("lapsed lease is taken over", LAPSED, step("acquire", "B"),
         "takeover: expired", _R, "B", _H, 2),
    case("same node retries a lapsed lease", LAPSED, step("acquire", "A2"),
         "acquired", _R, "A2", _H, 2),
    case("owner re-acquires its lapsed lease", LAPSED, _A, "acquired", _R, "A", _H, 2),
    case("lapsed at max attempts gives up", LAPSED, step("acquire", "B", max_attempts=1),
         "finished FAILED", "FAILED", "A", _U, 1, "gave_up"),
    case("released job is taken over", RELEASED, step("acquire", "B"),
         "takeover: released", _R, "B", _H, 2),
    case("released at max attempts gives up", RELEASED, step("acquire", "B", max_attempts=1),
         "finished FAILED", "FAILED", "A", _U, 1, "gave_up"),
    case("released below max attempts runs", RELEASED, step("acquire", "B", max_attempts=2),
         "takeover: released", _R, "B", _H, 2),
    case("interrupted attempt is handed back", INTERRUPTED, step("acquire", "B"),
         "takeover: released", _R, "B", _H, 1),
    case("stalled attempt's takeover says so", STALLED, step("acquire", "B"),
         "takeover: stalled", _R, "B", _H, 2),
    case("retried job is acquired afresh", RETRIED, step("acquire", "B"),
         "acquired", _R, "B", _H, 1),
    case("DONE is finished", DONE, step("acquire", "B"), "finished DONE", "DONE", "A", _U, 1),
    case("FAILED is finished", FAILED, step("acquire", "B"),
         "finished FAILED", "FAILED", "A", _U, 1, "error"),
    case("CANCELLED is finished", CANCELLED, step("acquire", "B"),
         "finished CANCELLED", "CANCELLED", "A", _U, 1),
    case("a fingerprint where none is stored follows", RUNNING,
         step("acquire", "B", fingerprint="fp-2"), "following", _R, "A", _U, 1),
    # -- renew -------------------------------------------------------------------------------
    case("renew without a record", NONE, REN, "refused: missing", None),
    case("renew by one who never owned", PENDING, REN, "refused: not_owner", "PENDING"),
    case("owner renews", RUNNING, REN, "renewed", _R, "A", _U, 1),
    case("renew by another owner", RUNNING, step("renew", "B"),
         "refused: not_owner", _R, "A", _U, 1),
    case("renew after the lease lapsed", LAPSED, REN, "refused: expired", _R, "A", _U, 1),
    case("renew without progress in budget", STALE, STALE_RENEW,
         "refused: no_progress", _R, "A", _U, 1),
    case("renew with new progress", STALE, PROGRESS_RENEW,
         "renewed", _R, "A", _U, 1),
    case("alert policy renews a stall", STALE_ALERT, STALE_RENEW,
         "renewed, stalled", _R, "A", _U, 1),
    case("renew after release", RELEASED, REN, "refused: not_running", "PENDING", "A", _U, 1),
    case("stale fence renews", TAKEN, REN, "refused: not_owner", _R, "B", _U, 2),
    case("renew after commit", DONE, REN, "refused: not_running", "DONE", "A", _U, 1),
    case("renew after cancel", CANCELLED, REN, "refused: not_running", "CANCELLED", "A", _U, 1),
    case("grace covers stale progress", STALE, GRACE_RENEW, "renewed", _R, "A", _U, 1),
    # -- release -----------------------------------------------------------------------------
    case("owner releases", RUNNING, step("release", "A"), "done", "PENDING", "A", _U, 1),
    case("interrupted owner hands its attempt back", RUNNING, INTERRUPT,
         "done", "PENDING", "A", _U, 0),
    case("release by another owner", RUNNING, step("release", "B"), "refused", _R, "A", _U, 1),
    case("lapsed owner may still release", LAPSED, step("release", "A"),
         "done", "PENDING", "A", _U, 1),
    case("stale fence releases", TAKEN, step("release", "A"), "refused", _R, "B", _U, 2),
    case("release after commit", DONE, step("release", "A"), "refused", "DONE", "A", _U, 1),
    case("release twice", RELEASED, step("release", "A"), "refused", "PENDING", "A", _U, 1),
    # -- commit ------------------------------------------------------------------------------
    case("owner commits", RUNNING, step("commit", "A"), "written DONE", "DONE", "A", _U, 1),
    case("commit without a record", NONE, step("commit", "A"), "rejected: missing", None),
    case("commit by another owner", RUNNING, step("commit", "B"),
         "rejected: newer_owner", _R, "A", _U, 1),
    case("lapsed owner commits, not taken over", LAPSED, step("commit", "A"),
         "written DONE", "DONE", "A", _U, 1),
    case("released owner's late commit lands", RELEASED, step("commit", "A"),
         "written DONE", "DONE", "A", _U, 1),
    case("stale fence commits", TAKEN, step("commit", "A"),
         "rejected: newer_owner", _R, "B", _U, 2),
    case("old owner commits after retry", RETRIED, step("commit", "A"),
         "rejected: newer_owner", "PENDING", None, _U, 0),
    case("owner's repeated commit", DONE, step("commit", "A"), "written DONE", "DONE", "A", _U, 1),
    case("commit meets another's result", DONE, step("commit", "B"),
         "rejected: already_committed", "DONE", "A", _U, 1),
    case("commit after failing", FAILED, step("commit", "A"),
         "rejected: already_finished", "FAILED", "A", _U, 1, "error"),
    case("commit after cancel", CANCELLED, step("commit", "A"),
         "rejected: cancelled", "CANCELLED", "A", _U, 1),
    case("commit by one who never owned", PENDING, step("commit", "A"),
         "rejected: newer_owner", "PENDING"),
    # -- fail --------------------------------------------------------------------------------
    case("owner fails", RUNNING, step("fail", "A"),
         "written FAILED", "FAILED", "A", _U, 1, "error"),
    case("fail without a record", NONE, step("fail", "A"), "rejected: missing", None),
    case("fail by another owner", RUNNING, step("fail", "B"),
         "rejected: newer_owner", _R, "A", _U, 1),
    case("owner's repeated fail", FAILED, step("fail", "A"),
         "written FAILED", "FAILED", "A", _U, 1, "error"),
    case("fail after commit", DONE, step("fail", "A"),
         "rejected: already_finished", "DONE", "A", _U, 1),
    case("fail after cancel", CANCELLED, step("fail", "A"),
         "rejected: cancelled", "CANCELLED", "A", _U, 1),
    # -- cancel ------------------------------------------------------------------------------
    case("cancel an unknown key", NONE, step("cancel"), "returns nothing", None),
    case("cancel a submitted job", PENDING, step("cancel"),
         "returns CANCELLED", "CANCELLED", None, _U, 0),
    case("cancel keeps the owner's pair", RUNNING, step("cancel"),
         "returns CANCELLED", "CANCELLED", "A", _U, 1),
    case("cancel leaves DONE as it is", DONE, step("cancel"), "returns DONE", "DONE", "A", _U, 1),
    case("cancel leaves CANCELLED as it is", CANCELLED, step("cancel"),
         "returns CANCELLED", "CANCELLED", "A", _U, 1),
    # -- report_stall ------------------------------------------------------------------------
    case("owner reports a stall", RUNNING, step("report_stall", "A"), "done", _R, "A", _U, 1),
    case("stall report by another owner", RUNNING, step("report_stall", "B"),
         "refused", _R, "A", _U, 1),
    case("stall report after commit", DONE, step("report_stall", "A"),
         "refused", "DONE", "A", _U, 1),
    case("lapsed owner reports a stall", LAPSED, step("report_stall", "A"),
         "done", _R, "A", _U, 1),
    # -- submit ------------------------------------------------------------------------------
    case("submit records a job", NONE, step("submit", fingerprint="fp-1"),
         "returns PENDING", "PENDING"),
    case("resubmit returns the job", PENDING, step("submit", fingerprint="fp-1"),
         "returns PENDING", "PENDING"),
    case("resubmit with another payload", PENDING, step("submit", fingerprint="fp-2"),
         "conflict", "PENDING"),
    case("submit gives a running job its spec", RUNNING, step("submit", fingerprint="fp-1"),
         "returns RUNNING", _R, "A", _U, 1),
    case("submit after the job ended", DONE, step("submit", fingerprint="fp-1"),
         "returns DONE", "DONE", "A", _U, 1),
    # -- retry -------------------------------------------------------------------------------
    case("retry a failed job", FAILED, step("retry"), "returns PENDING", "PENDING", None, _U, 0),
    case("retry a cancelled job", CANCELLED, step("retry"),
         "returns PENDING", "PENDING", None, _U, 0),
    case("retry leaves DONE as it is", DONE, step("retry"), "returns DONE", "DONE", "A", _U, 1),
    case("retry leaves RUNNING as it is", RUNNING, step("retry"),
         "returns RUNNING", _R, "A", _U, 1),
    case("retry an unknown key", NONE, step("retry"), "returns nothing", None),
)
# fmt: on
"""The table: every rule, one row each."""


# -- the table for people ---------------------------------------------------------------------

INTRO = """\
# The lease rules

Generated from `ai_lease/testing/rule_cases.py`; do not edit by hand. Regenerate it with:

```sh
python -m ai_lease.testing.rule_cases docs/rules.md
```

Each row is one rule case: from a starting state, one operation, the answer it gives and the
record afterwards (status, owner, whether the fencing token rose, attempts, a FAILED record's
failure kind: `ai_failure.py`). The same table
runs against the pure rules (`ai_lease/lease/rules.py`, what SQLite runs) and against the
SQLite, Redis and PostgreSQL stores through their public protocol
(`tests/test_rule_table.py`; `ai_lease.testing.rule_cases_run` runs it against any store).
A is an owner on one node, A2 another process on A's node, B an owner on another node.
"""


DECIDED = """\
## Two answers that are rules, not accidents

A commit is rejected exactly when a newer fencing token exists (someone else acquired the job)
or the job is already finished; the lease's time alone never rejects it. Two cases follow from
that, and both are kept on purpose:

- **A lapsed owner that nobody took over still commits** (*lapsed owner commits, not taken
  over*). No other owner holds a token, so no other answer can exist: taking this one keeps the
  one result per key and saves a second model call. The owner itself stops a margin before
  its lease could lapse (the self-fence, on its local monotonic clock), so this is a commit
  already on its way; once a follower takes over, the same commit is rejected (*stale fence
  commits*).
- **A released owner's late commit lands** (*released owner's late commit lands*). Release
  hands the job back without raising the token (the next acquire raises it), so until someone
  acquires, the releaser's token is still the newest and its answer is the job's one result.
"""


def _cell(value: object) -> str:
    return "–" if value is None else str(value).replace("|", "\\|")


def markdown() -> str:
    """The whole of ``docs/rules.md``: the intro, the starting states, the table by operation."""
    lines = [INTRO, "## Starting states", ""]
    lines += ["| state | what it is | reached by | the operation comes |", "|---|---|---|---|"]
    for state in STATES:
        steps = "; ".join(str(s) for s in state.steps) or "nothing"
        when = f"{WAIT:g} s later" if state.later else "at once"
        lines.append(f"| {state.name} | {state.title} | {_cell(steps)} | {when} |")
    counts = Counter(c.op.op for c in CASES)
    lines += ["", f"Short leases are {SHORT_TTL:g} s, the short stage budget {BUDGET:g} s, "
              f"everything else {LONG:g} s. {len(CASES)} cases."]  # fmt: skip
    for op in counts:
        lines += ["", f"## {op} ({counts[op]} cases)", ""]
        head = "| case | state | operation | answer | status | owner | token | attempts | kind |"
        lines += [head, "|---|---|---|---|---|---|---|---|---|"]
        for c in (c for c in CASES if c.op.op == op):
            a = c.after
            cells = (c.name, c.state.name, c.op, c.answer, a.status, a.owner, a.token, a.attempts,
                     a.kind)  # fmt: skip
            lines.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    lines += ["", DECIDED.rstrip("\n")]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Print :func:`markdown`, or write it to the path given (its folder made if missing)."""
    if not argv:
        sys.stdout.write(markdown())
        return 0
    path = Path(argv[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
