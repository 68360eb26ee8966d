"""Experiments: what re-runs the model (ablation, head importance, structural probes, the pattern CNN)."""
