"""What a run tells the world: events, metrics, logs, traces, stall snapshots, duration
history and the budgets tuned from it."""
