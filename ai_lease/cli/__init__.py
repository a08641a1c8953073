"""The ``ai-lease`` command line: commands, the live console, the demo and job files."""
