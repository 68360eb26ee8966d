"""Fine-tuning tasks: what a head is trained on and how a model is scored (see :mod:`bertology.tasks.base`)."""
