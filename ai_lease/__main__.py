"""``python -m ai_lease`` is the ``ai-lease`` command."""

from .cli import main

main(prog_name="ai-lease")
