"""``BertologyCallback``: bertology's analyses inside a Hugging Face ``Trainer`` run, as the model trains.

Every ``every_n_steps`` optimizer steps, at each evaluation and (``at_start``) once before the first
update, the callback compares the model being trained with its base on a small fixed probe set, with
the same streaming analyses ``bertology compare`` runs: ``representation_similarity`` (CKA and RSA per
layer, Merchant et al. 2020), ``attention_change`` (per head) and ``geometry`` (anisotropy per layer,
Ethayarajh 2019). With ``gradient_norms`` it also records the norm of each layer's gradient at every
``gradient_every_n_steps`` step (the stability check of Mosbach et al. 2021;
:mod:`bertology.integrations.gradients` says where they are read).

The base. Only the base's activations on the probe set are needed, so no copy of its weights is kept: at
``on_train_begin`` the model as it stands (or ``base=``, a model or a path, loaded, run and dropped) runs
once over the probe set on the training device and its activations are cached **on the CPU** (their
size: :func:`~bertology.integrations.snapshot.base_activations`; each analysis moves one batch to the
training device at a time). Each analysis pass costs one forward of the model over the probe set.

Bit-identical training. The analyses run under ``torch.no_grad()`` in eval mode; every module's mode
and the CPU/CUDA/NumPy/Python random states are restored afterwards
(:func:`~bertology.integrations.snapshot.quiet_forward`), and the gradient hooks only read. A run with
the callback ends with the same weights as one without (a test checks ``torch.equal``).

Outputs. With ``out=FOLDER`` a run folder of kind ``track`` with the tables ``bertology track`` writes:
``tables/track_<analysis>`` (the analysis's columns plus ``model``, ``checkpoint`` = ``step-N``,
``step``, ``event``) and ``tables/track_gradient_norms`` (``step, group, layer, metric, value,
n_params``), rewritten at every event, and at the end ``figures/track_*.svg`` (each metric over steps,
drawn by :func:`bertology.viz.track.track_figures`); ``bertology report FOLDER`` renders it.
:attr:`BertologyCallback.tables` holds the same tables in memory under the same names (``track_<analysis>``).

Logging. With ``log_to_trainer=True`` (after :meth:`BertologyCallback.attach`) the per-layer scalars go
through ``Trainer.log`` to whatever ``report_to`` names (TensorBoard, W&B ...): ``bertology/cka_linear/layer_3``
and so on. The analyses' scalars are logged when the analyses run (their own schedule: ``every_n_steps``, the
evaluations, step 0); the gradient norms, recorded every ``gradient_every_n_steps`` steps, follow the Trainer's
logging schedule (``logging_steps``, ``logging_first_step``, ``logging_strategy``): with each of the Trainer's own
training logs (the ones with ``loss``) go the norms of the latest recorded step, once; the table keeps every
recorded step. This module imports no tracker.

The work itself (probe set, base activations, analyses, gradient norms, tables, run folder) is a
:class:`~bertology.integrations.tracker.Tracker`, which ``bertology finetune --track-every`` drives from
bertology's own loop with the same events; this class only translates the Trainer's callbacks into them.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from transformers import TrainerCallback

from bertology.data.corpus import Corpus
from bertology.errors import BertologyError
from bertology.integrations.folder import table_name
from bertology.integrations.tracker import ANALYSES, GRADIENTS, CallbackSettings, Tracker, probe_corpus, scalars

logger = logging.getLogger(__name__)

__all__ = ["ANALYSES", "GRADIENTS", "BertologyCallback", "CallbackSettings", "probe_corpus", "scalars"]

#: How the gradient norms' scalars are named (``scalars``): they wait for the Trainer's next training log.
GRADIENT_SCALARS = "bertology/grad_norm/"


class BertologyCallback(TrainerCallback):
    """Runs bertology's analyses of the model in training against its base (see the module docs).

    ``probe``: the probe sentences (texts, a data file, or a Corpus); ``out``: the run folder (None: keep
    the tables in :attr:`tables` only); ``settings`` (:class:`CallbackSettings`) or its fields as keywords;
    ``analysis_settings``: settings of the analyses by name (``rsa_tokens``, ``attention_mode`` ...,
    as for ``bertology compare``); ``tokenizer``: default the Trainer's ``processing_class``; ``base``:
    a model or a path to compare with instead of the model as training begins.
    """

    def __init__(self, probe: Corpus | Sequence[str] | str | Path, out: str | Path | None = None,
                 settings: CallbackSettings | None = None, *, tokenizer: Any = None, base: Any = None,
                 text_column: str | None = None, analysis_settings: Mapping[str, Any] | None = None,
                 overwrite: bool = False, **values: Any):
        from bertology.settings import settings_object

        base_settings = settings_object(CallbackSettings, settings, "BertologyCallback")
        self.settings = settings_object(CallbackSettings, {**vars(base_settings), **values}, "BertologyCallback")
        self.tracker = Tracker(self.settings, probe_corpus(probe, text_column), out=out, tokenizer=tokenizer,
                               base=base, analysis_settings=analysis_settings, overwrite=overwrite, log=self._log)
        self.trainer = None
        #: the latest recorded gradient norms' scalars, not yet logged (sent with the Trainer's next training log)
        self._due_gradients: dict[str, float] | None = None
        self._sending = False  # our own Trainer.log call is under way (its on_log is not a training log)

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        """The tables so far, by the names their files have in the run folder: ``track_representation_similarity``
        ..., ``track_gradient_norms`` (``tables[name]`` holds the rows of ``out/tables/<name>.parquet``)."""
        return {table_name(name): table for name, table in self.tracker.tables.items()}

    @property
    def corpus(self) -> Corpus:
        """The probe set (its first ``max_examples`` examples)."""
        return self.tracker.corpus

    # ------------------------------------------------------------------------------ wiring
    def attach(self, trainer) -> "BertologyCallback":
        """Add the callback to ``trainer`` and keep it, so ``log_to_trainer`` can call ``trainer.log``."""
        trainer.add_callback(self)
        self.trainer = trainer
        return self

    # ------------------------------------------------------------------------------ events
    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        """Cache the base activations, arm the gradient hooks and (``at_start``) run the analyses at this step."""
        if self.settings.log_to_trainer and self.trainer is None:
            raise BertologyError("log_to_trainer=True needs the trainer: add the callback with callback.attach(trainer).")
        self.tracker.prepare(model, processing_class)
        self.tracker.begin(model, state.global_step)

    def on_step_begin(self, args, state, control, **kwargs):
        """Arm the gradient hooks when the coming step is one to record."""
        self.tracker.step_begin(state.global_step + 1)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        """Read the norms the hooks kept during this step's backward pass(es) (before clipping)."""
        self.tracker.after_backward(state.global_step + 1)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        """Record the step's gradient norms and, every ``every_n_steps``, run the analyses."""
        self.tracker.step_end(model, state.global_step)

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        """At each evaluation (``at_evaluate``): the analyses at this step, unless they already ran at it."""
        if self.settings.at_evaluate:
            self.tracker.prepare(model, kwargs.get("processing_class"))
            self.tracker.evaluated(model, state.global_step)

    def on_save(self, args, state, control, **kwargs):
        """A checkpoint was written: the run folder gets every row up to its step (a resumed run finds them)."""
        self.tracker.saved(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        """The Trainer logged: with one of its training logs (it has ``loss``; an evaluation's or the final summary's
        has not), send the gradient norms recorded since the last one (``log_to_trainer``)."""
        if self._sending or self._due_gradients is None or "loss" not in (logs or {}):
            return
        values, self._due_gradients = self._due_gradients, None
        self._send(values)

    def on_train_end(self, args, state, control, **kwargs):
        """Remove the gradient hooks; write the figures and mark the run folder complete."""
        self.tracker.end()
        self._due_gradients = None

    def _log(self, values: dict[str, float]) -> None:
        """Send ``values`` to the Trainer's loggers (``log_to_trainer``): the analyses' scalars now, the gradient
        norms' with the Trainer's next training log (:meth:`on_log`; a later step's norms replace unsent ones)."""
        if not (self.settings.log_to_trainer and values and self.trainer is not None):
            return
        if all(key.startswith(GRADIENT_SCALARS) for key in values):
            self._due_gradients = dict(values)
            return
        self._send(values)

    def _send(self, values: dict[str, float]) -> None:
        """``Trainer.log(values)``.

        ``Trainer.log`` clears ``control.should_log`` (its handler does, for every log); the flag is put back,
        or a step's own loss line, due right after the callbacks' ``on_step_end``, would not be logged.
        """
        due = self.trainer.control.should_log
        self._sending = True
        try:
            self.trainer.log(dict(values))
        finally:
            self._sending = False
        self.trainer.control.should_log = due
