"""The tracker: bertology's analyses of a model in training against its base, driven by a training loop's events.

One :class:`Tracker` holds what both loops share: the probe set, the base activations, the analyses run
at a step (:func:`~bertology.integrations.snapshot.snapshot`), the gradient norms
(:class:`~bertology.integrations.gradients.GradientNorms`), the tables and the run folder
(:class:`~bertology.integrations.folder.TrackWriter`). Two loops drive it with the same events:

* a Hugging Face ``Trainer``, through :class:`~bertology.integrations.trainer.BertologyCallback`;
* bertology's own fine-tuning loop (``bertology finetune --track-every N``), through
  :func:`finetune_tracker`, which :func:`bertology.training.loop.train_loop` calls as its ``observer``.

The events, with ``step`` the number of the optimizer step they belong to (1 for the first update):
:meth:`Tracker.prepare` (the model is still its base), :meth:`Tracker.begin`, then per step
:meth:`Tracker.step_begin`, :meth:`Tracker.after_backward` (the step's gradients are accumulated, not yet
clipped), :meth:`Tracker.step_end`, :meth:`Tracker.evaluated` at an evaluation, and :meth:`Tracker.end`.
This module imports no transformers.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from bertology.config import TRACK_ANALYSES, track_field
from bertology.data.corpus import Corpus
from bertology.errors import BertologyError
from bertology.integrations.gradients import GradientNorms
from bertology.integrations.snapshot import ProbeSet, base_activations, snapshot
from bertology.reach import declared
from bertology.settings import check_fields, setting_field, seed_field

logger = logging.getLogger(__name__)

#: The analyses a tracker can run: streaming ones that need nothing from the data but its text.
ANALYSES = TRACK_ANALYSES
GRADIENTS = "gradient_norms"
#: ``bertology finetune --track-every``'s run folder, inside the fine-tuning run folder (``bertology track``
#: keeps its per-checkpoint compare runs in ``track/``).
FINETUNE_FOLDER = "tracking"


@dataclass(frozen=True)
class CallbackSettings:
    """What a :class:`Tracker` (and :class:`~bertology.integrations.trainer.BertologyCallback`) computes, and when."""

    analyses: tuple[str, ...] = track_field("analyses")
    every_n_steps: int | None = track_field("every_n_steps")
    at_evaluate: bool = setting_field(True, "Run the analyses at each evaluation.")
    at_start: bool = setting_field(True, "Run the analyses once before the first update (step 0).")
    max_examples: int | None = track_field("max_examples")
    max_length: int = setting_field(128, "Skip probe examples longer than this many tokens (counted).", minimum=2)
    batch_size: int = setting_field(32, "Probe examples per forward pass.", minimum=1)
    gradient_norms: bool = setting_field(True, "Record each layer's gradient norm.", paper="Mosbach et al. 2021")
    gradient_every_n_steps: int = setting_field(1, "Record the gradient norms every N optimizer steps.", minimum=1)
    log_to_trainer: bool = setting_field(False, "Log the per-layer scalars through Trainer.log (needs attach).",
                                         changes_numbers=False)
    seed: int = seed_field("Seed of the analyses' token samples.")

    def __post_init__(self) -> None:
        check_fields(self)


def probe_corpus(probe: Corpus | Sequence[str] | str | Path | Any, text_column: str | None = None) -> Corpus:
    """The probe set: a Corpus, a list of texts, a data file (any format ``--data`` reads), or a table in memory (a
    DataFrame or ``datasets.Dataset``, e.g. the Trainer's eval set: its text column detected or ``text_column``)."""
    from bertology.data.frames import is_table
    from bertology.data.loaders import load_corpus

    if isinstance(probe, Corpus):
        return probe
    if isinstance(probe, (str, Path)) or is_table(probe):
        return load_corpus(probe, text_column=text_column)
    texts = [str(t) for t in probe]
    if not texts:
        raise BertologyError("The probe set is empty; give a few sentences or a data file.")
    return Corpus.from_list(texts, name="probe")


def scalars(name: str, table: pd.DataFrame) -> dict[str, float]:
    """The per-layer numbers worth a line in a tracker: ``bertology/<metric>/layer_<l>``.

    The gradient norms (``layer_<l>``, ``other``, ``total``); an analysis's are its spec's ``track.scalars``
    (:class:`bertology.reach.Track`; e.g. CKA/RSA at the same layer, each layer's mean attention cosine and JS
    divergence, the tuned model's anisotropy: :mod:`bertology.reach.views`), none when it declares none.
    """
    if name == GRADIENTS:
        return {f"bertology/grad_norm/{r.group if pd.isna(r.layer) or r.group == 'other' else f'layer_{r.layer}'}":
                float(r.value) for r in table.itertuples()}
    declared_track = declared("track").get(name)
    if declared_track is not None and declared_track.scalars is not None:
        return declared_track.scalars(table)
    return {}


class Tracker:
    """Runs the analyses of the model in training against its base at the loop's events (see the module docs).

    ``corpus``: the probe set; ``out``: the run folder (None: keep the tables in :attr:`tables` only);
    ``tokenizer``: may come later, with :meth:`prepare`; ``base``: a model or a path to compare with instead
    of the model as :meth:`prepare` finds it; ``log``: where each event's per-layer scalars go (None: nowhere);
    ``source``: who drives the tracker, for the manifest.
    """

    def __init__(self, settings: CallbackSettings, corpus: Corpus, *, out: str | Path | None = None,
                 tokenizer: Any = None, base: Any = None, analysis_settings: Mapping[str, Any] | None = None,
                 overwrite: bool = False, log: Callable[[dict[str, float]], None] | None = None,
                 source: str = "BertologyCallback (transformers Trainer)"):
        self.settings, self.corpus = settings, corpus.head(settings.max_examples)
        self.out = None if out is None else Path(out).expanduser()
        self.tokenizer, self.base, self.overwrite, self.log, self.source = tokenizer, base, overwrite, log, source
        self.analysis_settings = dict(analysis_settings or {})
        self._tables: dict[str, pd.DataFrame] = {}
        #: rows added since a table was last gathered (appended per step, concatenated once: not per step)
        self._chunks: dict[str, list[pd.DataFrame]] = {}
        #: tables with rows the run folder does not have yet (the gradient norms between writes)
        self._unwritten: set[str] = set()
        self.ready = False
        self._done_steps: set[int] = set()
        self._grads: GradientNorms | None = None
        self._pending_grads: pd.DataFrame | None = None
        self._writer = None

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table so far, its rows in the order they were added."""
        for name, chunks in self._chunks.items():
            if chunks:
                old = self._tables.get(name)
                self._tables[name] = pd.concat(([] if old is None else [old]) + chunks, ignore_index=True)
                chunks.clear()
        return self._tables

    @property
    def path(self) -> Path | None:
        """The run folder (None until :meth:`prepare`, or when the tables stay in memory)."""
        return None if self._writer is None else self._writer.path

    # ------------------------------------------------------------------------------ setting up
    def prepare(self, model, tokenizer: Any = None) -> None:
        """Tokenise the probe set, cache the base activations, open the run folder (once)."""
        from bertology.integrations.folder import TrackWriter
        from bertology.commands.selection import make_config

        if self.ready:
            return
        tokenizer = self.tokenizer = self.tokenizer or tokenizer
        if tokenizer is None:
            raise BertologyError("BertologyCallback needs the tokenizer: pass tokenizer= or give the Trainer a processing_class.")
        self.config = make_config("probe", tuned="training", analyses=self.settings.analyses, seed=self.settings.seed,
                                  batch_size=self.settings.batch_size, max_length=self.settings.max_length,
                                  **self.analysis_settings)
        if tuple(self.config.attention_measures) != ("weights",):  # refused, not silently read as weights
            raise BertologyError(
                f"attention_measures={','.join(self.config.attention_measures)}: tracking reads the attention weights "
                "only for now; compare a saved checkpoint with `bertology compare --attention-measures ...`.")
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
        self.ready = True

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
        from bertology.conventions import resolve as resolve_conventions
        from bertology.commands.selection import complete_config, select

        config = resolve_conventions(complete_config(self.config))
        ctx = BuildContext(int(model.config.num_hidden_layers), int(model.config.num_attention_heads),
                           self.tokenizer, probe.corpus, probe.encoded)
        return [spec.build(config, ctx) for spec in select(self.settings.analyses).analyses]

    def restore(self, step: int) -> None:
        """Keep the rows of the run folder's tables up to ``step`` (a run resumed from its checkpoint at ``step``).

        The rows after it (measured by the interrupted process past its last checkpoint) are dropped and measured
        again as training replays those steps; a folder of other settings, or none, gives nothing back.
        """
        from bertology.results import read_table

        if self._writer is None or not self._writer.opened.previous:
            return
        for name in sorted(self._writer.previous_tables):
            try:
                table = read_table(self.path, f"track_{name}")
            except Exception as err:  # noqa: BLE001 - an unreadable table is measured again, not fatal
                logger.warning("Could not read back %s/tables/track_%s (%s); its earlier rows are lost", self.path, name, err)
                continue
            kept = table[pd.to_numeric(table["step"]) <= step].reset_index(drop=True)
            if len(kept):
                self._add(name, kept, label=False)
        self._done_steps = {int(s) for name, t in self.tables.items() if name != GRADIENTS for s in t["step"]}

    # ------------------------------------------------------------------------------ events
    def begin(self, model, step: int = 0) -> None:
        """Arm the gradient hooks and (``at_start``) run the analyses at ``step``, the step training starts from
        (0, or a resumed run's checkpoint: then the folder's rows up to it are kept, :meth:`restore`)."""
        if self.settings.gradient_norms and self._grads is None:
            self._grads = GradientNorms(model)
        if step > 0:
            self.restore(step)
        if self.settings.at_start:
            self.analyse(model, step, "start")

    def step_begin(self, step: int) -> None:
        """Arm the gradient hooks when optimizer step ``step`` is one to record."""
        if self._grads is not None and step % self.settings.gradient_every_n_steps == 0:
            self._grads.arm()

    def after_backward(self, step: int) -> None:
        """Read the norms the hooks kept during step ``step``'s backward pass(es) (before clipping)."""
        if self._grads is not None and self._grads.armed:
            self._pending_grads = self._grads.read(step)

    def step_end(self, model, step: int) -> None:
        """Record the step's gradient norms and, every ``every_n_steps``, run the analyses."""
        if self._pending_grads is not None:
            grads, self._pending_grads = self._pending_grads, None
            self._add(GRADIENTS, grads)
            self._log(scalars(GRADIENTS, grads))
        n = self.settings.every_n_steps
        if n is not None and step % n == 0:
            self.analyse(model, step, "step")

    def evaluated(self, model, step: int) -> None:
        """At an evaluation (``at_evaluate``): the analyses at this step, unless they already ran at it."""
        if self.settings.at_evaluate:
            self.analyse(model, step, "evaluate")

    def saved(self, step: int) -> None:
        """A checkpoint of ``step`` was written: the run folder gets every row up to it, so a run resumed from
        that checkpoint finds them (:meth:`restore`)."""
        self._write_pending()

    def end(self, complete: bool = True) -> None:
        """Remove the gradient hooks; when training ``complete``\\ d, write the figures and mark the folder complete
        (an interrupted run leaves the folder ``running``, its tables as last rewritten, and releases it)."""
        if self._grads is not None:
            self._grads.remove()
            self._grads = None
        if self._writer is not None:
            self._write_pending()
            writer, self._writer = self._writer, None
            if complete:
                writer.finish(self.tables)
            else:
                writer.opened.close()

    # ------------------------------------------------------------------------------ work
    def analyse(self, model, step: int, event: str) -> None:
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

    def _add(self, name: str, rows: pd.DataFrame, label: bool = True) -> None:
        """Append rows to table ``name``; an analysis's table is rewritten in the run folder at once.

        The gradient norms come every step: rewriting their growing table each time made a long run's I/O
        quadratic in its steps. They are written with the analyses' tables, at each checkpoint (:meth:`saved`,
        so a resumed run finds every row up to its checkpoint) and at the end, interrupted or not.
        """
        if name == GRADIENTS and label:
            rows = _label(rows, int(rows["step"].iloc[0]), "step")
        self._chunks.setdefault(name, []).append(rows)
        self._unwritten.add(name)
        if name != GRADIENTS:
            self._write_pending()

    def _write_pending(self) -> None:
        """Rewrite in the run folder every table with rows it does not have yet."""
        if self._writer is None or not self._unwritten:
            return
        tables = self.tables
        for name in sorted(self._unwritten):
            self._writer.write(name, tables[name])
        self._unwritten.clear()

    def _log(self, values: dict[str, float]) -> None:
        if self.log is not None and values:
            self.log(dict(values))

    def record(self) -> dict:
        """What was tracked, for the manifest of the run that drove the tracker."""
        return {"folder": None if self.out is None else str(self.out), "every": self.settings.every_n_steps,
                "analyses": list(self.settings.analyses), "max_examples": self.settings.max_examples,
                "gradient_norms": self.settings.gradient_norms,
                "n_probe": len(self.corpus), "tables": sorted(f"track_{n}" for n in self.tables),
                "steps": sorted(self._done_steps)}


def _label(table: pd.DataFrame, step: int, event: str) -> pd.DataFrame:
    """``table`` with track's ``model``, ``checkpoint``, ``step`` columns (``step-N``) and the ``event``."""
    from bertology.commands.track import Checkpoint, label_rows

    t = table.drop(columns=[c for c in ("step",) if c in table.columns])
    t = label_rows(t, Checkpoint(f"step-{step}", step, Path(".")))
    t["event"] = event
    return t


def finetune_probe(data: Any) -> Corpus:
    """The probe set of a fine-tuning run: its held-out data as a Corpus (SQuAD data: the questions)."""
    if isinstance(data, Corpus):
        return data
    examples = getattr(data, "examples", None)
    if examples and hasattr(examples[0], "question"):
        return Corpus.from_list([ex.question for ex in examples], name=f"{getattr(data, 'name', 'squad')} (questions)")
    raise BertologyError(f"--track-every cannot probe with {type(data).__name__} data; it needs sentences.")


def finetune_tracker(config, tokenizer, probe: Any) -> Tracker:
    """The tracker of ``bertology finetune --track-every N``: every ``config.tracking.every`` steps, at step 0 and at
    each evaluation, the ``track_analyses`` on the first ``track_examples`` examples of ``probe`` (the held-out data)
    against the model as training begins, and each layer's gradient norm at every step, into ``<out>/tracking/``
    (a run folder of kind ``track``), CKA per layer in the log. The loop calls :meth:`Tracker.prepare` before it
    resumes from a checkpoint: the model is then still the base, so a resumed run compares with the same base, and
    keeps the folder's rows up to its checkpoint (:meth:`Tracker.restore`)."""
    settings = CallbackSettings(analyses=config.tracking.analyses, every_n_steps=config.tracking.every,
                                max_examples=config.tracking.examples, max_length=config.data.max_length,
                                seed=config.seed)
    return Tracker(settings, finetune_probe(probe), out=Path(config.out) / FINETUNE_FOLDER, tokenizer=tokenizer,
                   overwrite=True, log=_log_line, source="bertology finetune --track-every")


def _log_line(values: dict[str, float]) -> None:
    """One log line per event: CKA per layer and the total gradient norm (the rest is in the tables)."""
    cka = [f"{k.rsplit('_', 1)[-1]}: {v:.4f}" for k, v in values.items() if k.startswith("bertology/cka_linear/")]
    total = values.get("bertology/grad_norm/total")
    if cka:
        logger.info("tracking: CKA to the base per layer %s", ", ".join(cka))
    elif total is not None:
        logger.debug("tracking: gradient norm %.4g", total)
