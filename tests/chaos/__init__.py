"""Chaos scenarios: kills, pauses, blocked loops, network and upstream faults (issue 8)."""
