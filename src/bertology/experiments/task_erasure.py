"""What the tuned model's own task loses when a word property is erased from one layer (Elazar et al. 2021's
question, with LEACE: Belrose et al. 2023): the :class:`~bertology.experiments.interventions.Erase` intervention
run through the intervention sweep, so the rows are an ``ablation`` table (mode ``erase``, one unit per layer) with
the same paired bootstrap intervals, ``helps``/``hurts`` flags and degenerate-model check as every ablation.

The erasers come from the token probes (:func:`~bertology.experiments.token_probe.token_probes` with ``erasers=``),
fitted on the tuned model's own word vectors of the probe's training words.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from bertology.errors import BertologyError
from bertology.experiments.ablation_table import Bootstrap

if TYPE_CHECKING:
    from bertology.experiments.interventions import Erase
    from bertology.experiments.probe_features import FeaturePass
    from bertology.models.loading import LoadedModel

#: Why a task-side erasure cannot run without a fine-tuned model.
NEEDS_TUNED = "--erase-task-data (erase_task_data) scores the fine-tuned model's task: give --tuned."


def task_corpus(settings):
    """The labelled data of ``settings.erase_task_data`` with its column settings (read before any model runs, so a
    wrong path or column is one line at the start, not after the probes)."""
    from bertology.data.loaders import load_corpus

    return load_corpus(settings.erase_task_data, text_column=settings.erase_text_column,
                       pair_column=settings.erase_pair_column, label_column=settings.erase_label_column,
                       name="erase_task")


def erasure_effect(tuned: LoadedModel, corpus, erase: Erase, *, batch_size: int = 32, device: str = "cpu",
                   bootstrap: Bootstrap = Bootstrap(), max_length: int = 128, work_dir=None):
    """What the model's own task loses with ``erase.concept`` erased from each layer: the ``tuned`` model (with its
    task head) scored on ``corpus`` (labelled data of its task) intact and with each layer's eraser applied (``erase``,
    an :class:`~bertology.experiments.interventions.Erase` holding layer -> LEACE eraser, run through the
    intervention sweep: paired bootstrap intervals as ``bootstrap`` says, resumable from ``work_dir``). Returns the
    sweep's :class:`~bertology.experiments.ablation_table.AblationResult` (table ``ablation``, mode ``erase``)."""
    from bertology.data.encode import encode_corpus
    from bertology.experiments.scoring import HeadScoring
    from bertology.tasks.catalog import task_of_model

    model, tokenizer = tuned.model, tuned.tokenizer
    task = task_of_model(model)
    if task.token_level or task.name == "qa":
        raise BertologyError(f"Erasing from a {task.name} model's task is not supported yet: erasure scores a "
                             "sentence classifier or regressor on labelled sentences.")
    label_ids = task.targets(corpus, model)
    encoded = encode_corpus(corpus, tokenizer, max_length, overlong="truncate")
    scoring = HeadScoring.for_tokenizer(tokenizer, batch_size=batch_size, device=device)
    return erase.sweep(model, encoded, label_ids, scoring, n_bootstrap=bootstrap.n, seed=bootstrap.seed,
                       progress_dir=work_dir)


def task_erasure(models, erasers, settings, corpus, *, bootstrap: Bootstrap,
                 features: FeaturePass) -> tuple[object, dict]:
    """The tuned model's task with ``settings.erase``'s one property erased from each layer (``erasers`` as
    :func:`~bertology.experiments.token_probe.token_probes` fills it), scored on ``corpus`` (:func:`task_corpus`):
    the ``ablation`` table (mode ``erase``, one unit per layer) and the manifest's record, including the intact
    model's metrics. ``bootstrap``: the intervals' resamples; its ``seed`` also samples the examples.
    ``features``: the batch size, device and maximum length of the scoring passes, and their resumable
    ``work_dir`` (its ``layers`` and ``shared`` are not read: every layer with an eraser is a unit)."""
    from bertology.experiments.ablation import sample_examples
    from bertology.experiments.interventions import Erase

    if "tuned" not in models:
        raise BertologyError(NEEDS_TUNED)
    (concept,) = settings.erase
    tuned = models["tuned"]
    layered = {layer: e for (task, model, layer), e in erasers.items() if task == concept and model == "tuned"}
    corpus = sample_examples(corpus, settings.erase_max_examples, bootstrap.seed)
    result = erasure_effect(tuned, corpus, Erase(layered, concept), batch_size=features.batch_size,
                            device=features.device, bootstrap=bootstrap, max_length=features.max_length,
                            work_dir=features.work_dir)
    return result.table, {"concept": concept, "intact": result.intact, "n_examples": int(result.params["n_examples"]),
                          "method": result.params["method"], "degenerate": result.params["degenerate"],
                          "fitted_on": "the tuned model's training words of the probe data",
                          "applied_to": "every position of the hidden state"}


def task_erasure_line(table, concept: str) -> str | None:
    """One line: the layer whose erasure costs the task most (its delta and interval), and whether it hurts."""
    from bertology.tasks.catalog import task_of_table

    main = task_of_table(table).primary
    rows = table[(table["target"] != "intact") & (table["metric"] == main)]
    if rows.empty:
        return None
    worst = rows.loc[rows["delta"].idxmin()]
    hurts = int(rows["hurts"].sum())
    return (f"erasing {concept} from the tuned model: largest {main} change at {worst.label}, "
            f"{worst.delta:+.3f} [{worst.ci_low:+.3f}, {worst.ci_high:+.3f}]; {hurts} of {len(rows)} layer(s) hurt "
            "beyond the 95% CI")
