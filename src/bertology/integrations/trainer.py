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
drawn by :func:`bertology.study.track.track_figures`); ``bertology report FOLDER`` renders it. With
``log_to_trainer=True`` (after :meth:`BertologyCallback.attach`) the per-layer scalars go through
``Trainer.log`` to whatever ``report_to`` names (TensorBoard, W&B ...): ``bertology/cka_linear/layer_3``
and so on; this module imports no tracker.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from transformers import TrainerCallback

from bertology.data.corpus import Corpus
from bertology.errors import BertologyError
from bertology.integrations.gradients import GradientNorms
from bertology.integrations.snapshot import ProbeSet, base_activations, snapshot
from bertology.settings import check_fields, comma_list, setting_field

logger = logging.getLogger(__name__)

#: The analyses the callback can run: streaming ones that need nothing from the data but its text.
ANALYSES = ("representation_similarity", "attention_change", "geometry")
GRADIENTS = "gradient_norms"


@dataclass(frozen=True)
class CallbackSettings:
    """What :class:`BertologyCallback` computes, and when."""

    analyses: tuple[str, ...] = setting_field(
        ("representation_similarity", "attention_change"), "Comma list of analyses to run against the base.",
        parse=comma_list, choices=ANALYSES, metavar="NAMES")
    every_n_steps: int | None = setting_field(0, "Run the analyses every N optimizer steps (0 = never).", minimum=1,
                                              zero_is_none=True)
    at_evaluate: bool = setting_field(True, "Run the analyses at each evaluation.")
    at_start: bool = setting_field(True, "Run the analyses once before the first update (step 0).")
    max_examples: int | None = setting_field(64, "Use the first N probe examples (0 = all).", minimum=1,
                                             zero_is_none=True)
    max_length: int = setting_field(128, "Skip probe examples longer than this many tokens (counted).", minimum=2)
    batch_size: int = setting_field(32, "Probe examples per forward pass.", minimum=1)
    gradient_norms: bool = setting_field(True, "Record each layer's gradient norm.", paper="Mosbach et al. 2021")
    gradient_every_n_steps: int = setting_field(1, "Record the gradient norms every N optimizer steps.", minimum=1)
    log_to_trainer: bool = setting_field(False, "Log the per-layer scalars through Trainer.log (needs attach).",
                                         changes_numbers=False)
    seed: int = setting_field(0, "Seed of the analyses' token samples.")

    def __post_init__(self) -> None:
        check_fields(self)


def probe_corpus(probe: Corpus | Sequence[str] | str | Path, text_column: str | None = None) -> Corpus:
    """The probe set: a Corpus, a list of texts, or a data file (any format ``--data`` reads)."""
    from bertology.data.loaders import load_corpus

    if isinstance(probe, Corpus):
        return probe
    if isinstance(probe, (str, Path)):
        return load_corpus(probe, text_column=text_column)
    texts = [str(t) for t in probe]
    if not texts:
        raise BertologyError("The probe set is empty; give a few sentences or a data file.")
    return Corpus.from_list(texts, name="probe")


def scalars(name: str, table: pd.DataFrame) -> dict[str, float]:
    """The per-layer numbers worth a line in a tracker: ``bertology/<metric>/layer_<l>``.

    CKA/RSA at the same layer, each layer's mean attention cosine and JS divergence, the tuned model's
    anisotropy, and the gradient norms (``layer_<l>``, ``other``, ``total``).
    """
    if name == "representation_similarity":
        t = table[(table["layer_base"] == table["layer_tuned"]) & table["metric"].isin(["cka_linear", "rsa_pearson"])]
        return {f"bertology/{r.metric}/layer_{r.layer_base}": float(r.value) for r in t.itertuples()}
    if name == "attention_change":
        means = table.groupby("layer")[["cosine", "js_divergence"]].mean()
        return {f"bertology/attention_{m}/layer_{layer}": float(v) for layer, row in means.iterrows() for m, v in row.items()}
    if name == "geometry":
        t = table[(table["model"] != "base") & (table["metric"] == "anisotropy")]
        return {f"bertology/anisotropy/layer_{r.layer}": float(r.value) for r in t.itertuples()}
    if name == GRADIENTS:
        return {f"bertology/grad_norm/{r.group if pd.isna(r.layer) or r.group == 'other' else f'layer_{r.layer}'}":
                float(r.value) for r in table.itertuples()}
    return {}


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
        self.corpus = probe_corpus(probe, text_column).head(self.settings.max_examples)
        self.out = None if out is None else Path(out).expanduser()
        self.tokenizer, self.base, self.overwrite = tokenizer, base, overwrite
        self.analysis_settings = dict(analysis_settings or {})
        self.tables: dict[str, pd.DataFrame] = {}
        self.trainer = None
        self._ready = False
        self._done_steps: set[int] = set()
        self._grads: GradientNorms | None = None
        self._pending_grads: pd.DataFrame | None = None
        self._writer = None

    # ------------------------------------------------------------------------------ wiring
    def attach(self, trainer) -> "BertologyCallback":
        """Add the callback to ``trainer`` and keep it, so ``log_to_trainer`` can call ``trainer.log``."""
        trainer.add_callback(self)
        self.trainer = trainer
        return self

    def _prepare(self, model, tokenizer) -> None:
        """Tokenise the probe set, cache the base activations, open the run folder (once)."""
        from bertology.integrations.folder import TrackWriter
        from bertology.pipeline import make_config

        tokenizer = self.tokenizer = self.tokenizer or tokenizer
        if tokenizer is None:
            raise BertologyError("BertologyCallback needs the tokenizer: pass tokenizer= or give the Trainer a processing_class.")
        self.config = make_config("probe", tuned="training", analyses=self.settings.analyses, seed=self.settings.seed,
                                  batch_size=self.settings.batch_size, max_length=self.settings.max_length,
                                  **self.analysis_settings)
        sizes = dict(max_length=self.settings.max_length, batch_size=self.settings.batch_size)
        probe = ProbeSet.build(self.corpus, tokenizer, **sizes)
        probe_analyses = self._build(model, probe)
        pad_to = max((a.extraction_options().get("pad_to") or 0 for a in probe_analyses), default=0) or None
        # batched again only when an analysis asks for padded maps (attention_mode="padded")
        self.probe = probe if pad_to is None else ProbeSet.build(self.corpus, tokenizer, pad_to=pad_to, **sizes)
        self.requires = frozenset().union(*(a.requires for a in probe_analyses))
        self.base_cache = base_activations(self._base_model(model), self.probe, self.requires)
        self.base = None  # a base given by path or object is not kept: its activations are
        if self.out is not None:
            self._writer = TrackWriter(self.out, self, overwrite=self.overwrite)
        self._ready = True

    def _base_model(self, model):
        """The model to take the base activations from: ``base`` (loaded onto the training device) or ``model``."""
        if self.base is None:
            return model
        from bertology.integrations.snapshot import model_device
        from bertology.models.loading import load_model

        other = load_model(self.base).model if isinstance(self.base, (str, Path)) else self.base
        shape = lambda m: (m.config.num_hidden_layers, m.config.num_attention_heads, m.config.hidden_size)  # noqa: E731
        if shape(other) != shape(model):
            raise BertologyError(f"The base has shape {shape(other)} (layers, heads, hidden), the model in training "
                                 f"{shape(model)}; compare a model with the encoder it was fine-tuned from.")
        return other.to(model_device(model))

    def _build(self, model, probe: ProbeSet) -> list:
        """Fresh analyses for one pass (built from the registry with the run's settings, as compare builds them)."""
        from bertology.analyses.registry import BuildContext
        from bertology.pipeline import complete_config, select
        from bertology.conventions import resolve as resolve_conventions

        config = resolve_conventions(complete_config(self.config))
        ctx = BuildContext(int(model.config.num_hidden_layers), int(model.config.num_attention_heads),
                           self.tokenizer, probe.corpus, probe.encoded)
        return [spec.build(config, ctx) for spec in select(self.settings.analyses).analyses]

    # ------------------------------------------------------------------------------ events
    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        """Cache the base activations, arm the gradient hooks and (``at_start``) run the analyses at this step."""
        if self.settings.log_to_trainer and self.trainer is None:
            raise BertologyError("log_to_trainer=True needs the trainer: add the callback with callback.attach(trainer).")
        if not self._ready:
            self._prepare(model, processing_class)
        if self.settings.gradient_norms and self._grads is None:
            self._grads = GradientNorms(model)
        if self.settings.at_start:
            self._analyse(model, state.global_step, "start")

    def on_step_begin(self, args, state, control, **kwargs):
        """Arm the gradient hooks when the coming step is one to record."""
        if self._grads is not None and (state.global_step + 1) % self.settings.gradient_every_n_steps == 0:
            self._grads.arm()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        """Read the norms the hooks kept during this step's backward pass(es) (before clipping)."""
        if self._grads is not None and self._grads.armed:
            self._pending_grads = self._grads.read(state.global_step + 1)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        """Record the step's gradient norms and, every ``every_n_steps``, run the analyses."""
        if self._pending_grads is not None:
            grads, self._pending_grads = self._pending_grads, None
            self._add(GRADIENTS, grads)
            self._log(scalars(GRADIENTS, grads))
        n = self.settings.every_n_steps
        if n is not None and state.global_step % n == 0:
            self._analyse(model, state.global_step, "step")

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        """At each evaluation (``at_evaluate``): the analyses at this step, unless they already ran at it."""
        if self.settings.at_evaluate:
            if not self._ready:
                self._prepare(model, kwargs.get("processing_class"))
            self._analyse(model, state.global_step, "evaluate")

    def on_train_end(self, args, state, control, **kwargs):
        """Remove the gradient hooks; write the figures and mark the run folder complete."""
        if self._grads is not None:
            self._grads.remove()
            self._grads = None
        if self._writer is not None:
            self._writer.finish(self.tables)

    # ------------------------------------------------------------------------------ work
    def _analyse(self, model, step: int, event: str) -> None:
        """Run every analysis at ``step`` (once per step), keep their tables, log their scalars."""
        if step in self._done_steps:
            return
        self._done_steps.add(step)
        analyses = snapshot(model, self.probe, self.base_cache, self._build(model, self.probe), self.requires)
        logged: dict[str, float] = {}
        for analysis in analyses:
            table = analysis.compute().table
            self._add(analysis.name, _label(table, step, event))
            logged.update(scalars(analysis.name, table))
        self._log(logged)

    def _add(self, name: str, rows: pd.DataFrame) -> None:
        """Append rows to table ``name`` (and rewrite it in the run folder)."""
        if name == GRADIENTS:
            rows = _label(rows, int(rows["step"].iloc[0]), "step")
        old = self.tables.get(name)
        self.tables[name] = rows if old is None else pd.concat([old, rows], ignore_index=True)
        if self._writer is not None:
            self._writer.write(name, self.tables[name])

    def _log(self, values: dict[str, float]) -> None:
        """Send ``values`` to the Trainer's loggers (``log_to_trainer``).

        ``Trainer.log`` clears ``control.should_log`` (its handler does, for every log); the flag is put back,
        or a step's own loss line, due right after the callbacks' ``on_step_end``, would not be logged.
        """
        if self.settings.log_to_trainer and values and self.trainer is not None:
            control = self.trainer.control
            due = control.should_log
            self.trainer.log(dict(values))
            self.trainer.control.should_log = due


def _label(table: pd.DataFrame, step: int, event: str) -> pd.DataFrame:
    """``table`` with track's ``model``, ``checkpoint``, ``step`` columns (``step-N``) and the ``event``."""
    from bertology.study.track import Checkpoint, label_rows

    t = table.drop(columns=[c for c in ("step",) if c in table.columns])
    t = label_rows(t, Checkpoint(f"step-{step}", step, Path(".")))
    t["event"] = event
    return t
