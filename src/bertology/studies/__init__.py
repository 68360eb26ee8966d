"""Studies: one base against many tuned models (tasks x seeds, checkpoints of one run), run as jobs of the commands
(compare, finetune) and judged against seed noise. The notebook face is :func:`bertology.api.study` (``bt.study``);
the command line's is ``bertology study``."""
