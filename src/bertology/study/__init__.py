"""Studies: one base against many tuned models — checkpoints of one run (track) and, later, tasks x seeds."""
