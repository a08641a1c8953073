"""The dashboard (`ai-lease ui`) tested in a real browser: Debian's headless Chromium."""
