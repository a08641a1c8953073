"""The web dashboard (``ai-lease ui``)."""
