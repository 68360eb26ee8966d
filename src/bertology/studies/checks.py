"""A study checked before its folder is touched: every check its jobs would make that needs no training.

:func:`check_study` runs, in this order, the checks that would otherwise fail inside every job (the same
failure once per seed, then a study with nothing to summarise):

1. the device (:func:`~bertology.models.device.resolve_device`: ``cuda`` without CUDA, ``cuda:7``, ``mps``
   off Apple silicon, a garbage string);
2. the comparison's settings as a comparison job resolves them (every declared setting, the conventions,
   the analyses, the dtype on the device: :func:`~bertology.commands.compare.resolve_settings`);
3. the base, loaded once on the CPU, and the given fine-tunes against it (layers, heads, tokenizer);
4. each task's data, read as its fine-tunes read it, and its fine-tuning settings as a run resolves them
   (the task's recipe, the dtype on the device), then against the base: ``freeze_layers`` within its
   layers, LoRA targets that name at least one of its modules;
5. the comparison corpora, read as the comparisons read them;
6. analyses named in ``[compare]`` that need data the spec does not give (the probes without their
   treebanks, a classifier's ablation on a corpus without labels).

Each refusal is one :class:`~bertology.errors.BertologyError` line naming where in the spec the setting is
(``device``, ``[compare]``, ``task 'sst2'``). The settings' own declarations are checked earlier, when the
spec is read (:func:`bertology.studies.spec.load_spec`).
"""
from __future__ import annotations

from pathlib import Path

from bertology.errors import BertologyError
from bertology.studies.jobs import CompareJob, FinetuneJob
from bertology.studies.spec import StudySpec, TaskSpec, check_models

#: Experiments whose refusal reads only the comparison's settings (the probes: their treebank files), so it can
#: be asked before any model is trained.
SETTINGS_ONLY_REFUSALS = ("probe",)
#: The tasks whose models an ablation scores on sentence labels (a tagger or a parser reads its own targets).
SENTENCE_TASKS = ("classification", "regression")


def check_study(spec: StudySpec, *, here: bool = True) -> None:
    """Every check of the module docs, in order; the first problem is one error, before anything is written.

    ``here``: the jobs run on this machine (the local executor). Only then is the device checked to exist and to
    run the dtypes asked for; on Ray the workers' devices are not this machine's, so only its name is checked."""
    check_device(spec.device, here=here)
    config, selection = check_compare_settings(spec, here=here)
    from bertology.models.loading import load_model

    base = load_model(spec.base)
    check_models(spec, base=base)
    kinds = {task.name: check_task(spec, task, base.model, here=here) for task in spec.tasks
             if not task.models and task.seeds}
    corpus = check_compare_data(spec)
    check_analyses(spec, config, selection, corpus, kinds)


def check_device(device: str, *, here: bool = True) -> None:
    """The spec's ``device`` as every job resolves it (``here=False``: only that torch can read the name); one line
    naming it."""
    from bertology.models.device import resolve_device

    try:
        resolve_device(device if here or device == "auto" else _named_device(device))
    except BertologyError as err:
        raise BertologyError(f"device = {device!r}: {err}") from None


def _named_device(device: str) -> str:
    """``cpu`` when torch can read ``device`` as a device name (whether this machine has it or not), else ``device``
    (for :func:`~bertology.models.device.resolve_device`'s error)."""
    import torch

    try:
        torch.device(device)
    except (RuntimeError, ValueError):
        return device
    return "cpu"


def check_compare_settings(spec: StudySpec, *, here: bool = True):
    """``[compare]`` as a comparison job resolves it (declared settings, conventions, analyses; ``here``: the device
    and its dtype too); the resolved config and the selection. The global random state is left as it was."""
    import torch

    from bertology.conventions import resolve as resolve_conventions
    from bertology.commands.compare import resolve_settings
    from bertology.commands.selection import complete_config, select

    job = CompareJob("check:compare", "compare", spec.base, (), spec.compare, spec.device, "", "")
    try:
        if not here:
            config = resolve_conventions(complete_config(job.config()))
            return config, select(config.analyses)
        with torch.random.fork_rng(devices=[]):  # the resolution seeds torch
            config, selection, _ = resolve_settings(job.config())
    except BertologyError as err:
        raise BertologyError(f"[compare]: {err}") from None
    return config, selection


def check_task(spec: StudySpec, task: TaskSpec, base, *, here: bool = True) -> str:
    """Read ``task``'s data and resolve its fine-tuning settings as its first seed's job does, then check them
    against the ``base`` model; the task the fine-tunes will train (``auto`` decided). One line naming the task."""
    from bertology.models.device import resolve_device
    from bertology.models.precision import resolve_dtype
    from bertology.training.finetune import read_data, resolve_run_config, trainer_for

    job = FinetuneJob(f"check:{task.name}", task, task.seeds[0], spec.base, task.lab(spec.lab), spec.device, "", "")
    try:
        config = job.config()
        train, _ = read_data(config)
        config = resolve_run_config(config, train)  # the task decided, the recipe filled in, every bound checked
        if here:
            resolve_dtype(config.dtype, resolve_device(config.device))
        check_against_base(config, base)
    except BertologyError as err:
        raise BertologyError(f"task {task.name!r}: {err}") from None
    # what the run trains (classification for a task of type auto with 0/1 labels), as its recipe records it
    return (config.recipe or {}).get("task") or trainer_for(config, train).recipe_name


def check_against_base(config, model) -> None:
    """The fine-tuning settings that name parts of the model, against ``model`` (the base, loaded): the bottom
    layers to freeze, and with LoRA the modules to adapt (default: the family's query and value)."""
    from bertology.training.surgery import check_freeze_layers

    if config.surgery.freeze_layers:
        check_freeze_layers(model, config.surgery.freeze_layers)
    if config.method == "lora":
        from bertology.training.lora import check_targets, default_targets, peft_library

        peft_library()
        check_targets(model, tuple(config.lora.targets) or default_targets(model))


def check_compare_data(spec: StudySpec):
    """Read the comparison corpus (and the out-of-domain one) as the comparisons will; the comparison corpus."""
    from bertology.config import DataConfig
    from bertology.commands.compare_data import load_data

    c = spec.compare
    corpora = [("data", DataConfig(path=c.data, text_column=c.text_column, pair_column=c.pair_column,
                                   label_column=c.label_column, max_examples=c.max_examples))]
    if c.ood_data:
        corpora.append(("ood_data", DataConfig(path=c.ood_data, text_column=c.ood_text_column,
                                               max_examples=c.max_examples)))
    read = []
    for key, data in corpora:
        try:
            read.append(load_data(data))
        except BertologyError as err:
            raise BertologyError(f"[compare] {key}: {err}") from None
    return read[0]


def check_analyses(spec: StudySpec, config, selection, corpus, kinds: dict[str, str]) -> None:
    """Refuse an analysis named in ``[compare]`` that needs data the spec does not give, in the line the comparison
    would fail every job with: the probes without their treebanks (the probes' own refusal), and an ablation on a
    corpus without labels when every model the study trains is scored on sentence labels."""
    from bertology.experiments.catalog import EXPERIMENTS
    from bertology.experiments.registry import ExperimentContext

    for name in SETTINGS_ONLY_REFUSALS:
        if name in selection.named:
            experiment = EXPERIMENTS.spec(name)
            reason = experiment.skip_reason(ExperimentContext(config, None, corpus, Path()))  # reads the settings only
            if reason is not None:
                raise BertologyError(f"[compare] analyses: {experiment.refusal(reason)}")
    trained_only = all(not t.models for t in spec.tasks)
    if ("ablation" in selection.named and trained_only and kinds and all(k in SENTENCE_TASKS for k in kinds.values())
            and not any(ex.label is not None for ex in corpus)):
        reason = f"{corpus.source} has no labels (name its label column with label_column in [compare])"
        raise BertologyError(f"[compare] analyses: {EXPERIMENTS.spec('ablation').refusal(reason)}")
