"""``python -m ai_lease`` is the ``ai-lease`` command."""

from ai_lease.cli.app import main

main(prog_name="ai-lease")
