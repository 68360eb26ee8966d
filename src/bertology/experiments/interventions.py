"""Interventions as objects: what an ablation sweep does to one unit of the tuned model, one class each.

An intervention has a ``name`` (the mode the CLI names it by and the table's ``mode`` column holds), its ``units``
(which heads, blocks or layers it changes, one at a time), ``apply(model, unit)`` (a context manager that changes the
model and restores it bit for bit on exit) and ``columns`` (the columns of the table its rows go to, ``table``).
The sweep, the layer cache, scoring, the studies and the report read what they need from the object (whether it
needs the base model, whether head importance goes with it, its words, its report section) instead of comparing
mode strings; the registry :data:`INTERVENTIONS` maps the CLI's names to them.

* :class:`HeadMask` (``uniform``: attention 1/L, Kovaleva et al. 2019; ``zero``; ``mean``): every head alone and
  every layer skipped or with all its heads masked (the batched head sweep of
  :mod:`bertology.experiments.ablation_sweep`);
* :class:`Revert` (``revert``, Tamkin et al. 2020): the base model's weights put back into one unit
  (:mod:`bertology.experiments.revert_sweep`), run by the generic sweep of
  :mod:`bertology.experiments.intervention_sweep`;
* :class:`Transplant` (``transplant``): the base encoder under the tuned head plus one tuned unit, its own table
  (:mod:`bertology.experiments.transplant_sweep`).

A new intervention (grafting, LEACE erasure ...) is one subclass of :class:`Intervention` with ``units`` and
``apply`` (and ``start`` when it leaves the layers below a unit unchanged); :func:`run_intervention` runs it.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import torch

from bertology.errors import BertologyError
from bertology.experiments.ablation_sweep import run_ablation
from bertology.experiments.ablation_table import TABLE, TABLE_COLUMNS, AblationResult
from bertology.experiments.ablation_units import LAYER_MODES, SweepPlan, Unit, plan_units
from bertology.experiments.intervention_sweep import run_intervention
from bertology.experiments.layer_cache import first_layer
from bertology.experiments.revert_sweep import base_fingerprint, plan_revert_units, unit_of
from bertology.experiments.scoring import HeadScoring
from bertology.experiments.transplant_score import TABLE as TRANSPLANT_TABLE
from bertology.experiments.transplant_score import TABLE_COLUMNS as TRANSPLANT_COLUMNS
from bertology.models import sites
from bertology.models.ablate import ablate_head_groups, skip_layers
from bertology.models.revert import REVERT_UNITS, check_base, piece_names, reverted

#: Why the base-model interventions run no head importance: Michel et al.'s importance removes heads.
NO_IMPORTANCE = ("not run in {name} mode: head importance and pruning remove heads (Michel et al. 2019), "
                 "they do not {verb} them")


@dataclass(frozen=True)
class Words:
    """How the summary, the report and the figures say what an intervention did (``{mode}``: its name)."""

    verb: str = "remove"  # the summary: "revert" / "remove"
    noun: str = "removal"  # "removal hurts beyond the 95% CI"
    plural: str = "Removals"  # the report: "Removals that hurt accuracy"
    done: str = "Removed"  # the report table's unit column
    participle: str = "disabled"  # "when one head is disabled"
    head: str = "disabled ({mode})"  # the head heat map's title: "when one head is disabled (uniform)"
    layer: str = "whole layer is disabled"  # the layer bars' title
    needed: str = "Unit the task needs most"  # the report's overview card
    needed_how: str = "disabled ({mode})"  # "... when disabled (uniform)"
    helps: str = "removal"  # "units whose removal improves the task"
    how: str = "{mode}"  # how one head is changed, in the captions (``{special}``: the [CLS]/[SEP] note)
    lede: str = ""  # the report section's opening paragraph (``{metrics}``), when its section's own does not fit
    layer_caption: str = ""  # the layer bars' caption (``{what}``: the metric), likewise


REMOVE = Words()
REVERT_WORDS = Words("revert", "revert", "Reverts", "Reverted", "reverted", "reverted", "unit is reverted",
                     "Change the task needs most", "reverted to the base", "revert to the base",
                     "its weights put back to the base model's")


class Intervention:
    """What every intervention has (override what differs); see the module docstring."""

    name: str = ""
    #: The table its rows go to and that table's columns.
    table: ClassVar[str] = TABLE
    columns: ClassVar[tuple[str, ...]] = tuple(TABLE_COLUMNS)
    #: The report section that draws its rows (``bertology.report.sections``).
    section: ClassVar[str] = "ablation"
    #: Whether it reads the base model (``--base``).
    needs_base: ClassVar[bool] = False
    #: Whether head importance and the pruning curve (Michel et al. 2019) go with its sweep.
    head_importance: ClassVar[bool] = False
    words: ClassVar[Words] = REMOVE
    #: The whole-layer units it runs by default and those it accepts (``--layer-modes``).
    default_layer_modes: ClassVar[tuple[str, ...]] = ()
    allowed_layer_modes: ClassVar[tuple[str, ...]] = ()
    delta_note: ClassVar[str] = ("intervened minus intact; helps = ci_low > 0 where higher is better, ci_high < 0 "
                                 "where lower is")

    # ---------------------------------------------------------------- the interface
    def units(self, model: torch.nn.Module, sweep: SweepPlan = SweepPlan()) -> list[Unit]:
        """The units of one sweep, the intact model left out."""
        raise NotImplementedError

    def apply(self, model: torch.nn.Module, unit: Unit) -> AbstractContextManager[None]:
        """Change ``model`` for ``unit`` inside a ``with`` block; restored on exit, even when the body raises."""
        raise NotImplementedError

    def start(self, model: torch.nn.Module, unit: Unit) -> int:
        """The first block (1-based) ``unit`` changes, L + 1 for the intact model; 0 (a full forward) unless known."""
        return sites.num_layers(model) + 1 if unit.target == "intact" else 0

    # ---------------------------------------------------------------- what the sweep and the study read
    def layer_modes(self, given: Sequence[str]) -> tuple[str, ...]:
        """The whole-layer units a sweep runs for ``--layer-modes`` ``given`` (:data:`LAYER_MODES` = not given)."""
        if tuple(given) == LAYER_MODES:
            return self.default_layer_modes
        wrong = [m for m in given if m not in self.allowed_layer_modes]
        if wrong:
            raise BertologyError(f"--layer-modes (layer_modes) {', '.join(wrong)} cannot go with --mode {self.name}: "
                                 f"{self.takes()} {', '.join(self.allowed_layer_modes) or 'nothing'} or none.")
        return tuple(given)

    def takes(self) -> str:
        """Who takes the allowed layer modes, for the refusal (``uniform, zero and mean take``)."""
        return f"{self.name} takes"

    def bound(self, base: torch.nn.Module | None) -> Intervention:
        """This intervention with the base model it reads (refused with one line when it needs one and has none)."""
        if self.needs_base and base is None:
            raise BertologyError(f"Ablation mode {self.name} needs the base model (--base): the pretrained model the "
                                 "tuned one was fine-tuned from.")
        return self

    def plan(self, model: torch.nn.Module, sweep: SweepPlan) -> tuple[list[Unit], str | None]:
        """Intact first, then :meth:`units`; and why some units were refused (None when none was)."""
        return [Unit("intact"), *self.units(model, sweep)], None

    def prepare(self, model: torch.nn.Module, scoring: HeadScoring) -> None:
        """Checks and device moves before the sweep (a base model beside the tuned one)."""

    def fingerprint(self) -> dict[str, Any]:
        """What, besides the model and the data, the numbers depend on (in the resume fingerprint)."""
        return {}

    def fingerprint_params(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """What of :meth:`fingerprint` the manifest keeps."""
        return {}

    def plan_params(self, sweep: SweepPlan) -> dict[str, Any]:
        """The manifest's words for the planned layer units."""
        return {"layer_modes": list(sweep.layer_modes)}

    def scoring_mode(self) -> str:
        """The head mode :class:`HeadScoring` is built with (unused by interventions that mask no head)."""
        return "uniform"

    def no_importance(self) -> str:
        """Why this intervention's run has no head importance (the manifest says so)."""
        return NO_IMPORTANCE.format(name=self.name, verb=self.words.verb)

    def sweep(self, model: torch.nn.Module, encoded, label_ids, scoring: HeadScoring, **run) -> AblationResult:
        """The ``ablation`` table of this intervention (``run``: the keywords of :func:`run_intervention`)."""
        return run_intervention(model, self, encoded, label_ids, scoring, **run)


@dataclass(frozen=True)
class HeadMask(Intervention):
    """A head disabled by a hook: ``uniform`` (attention 1/L over the tokens), ``zero`` or ``mean`` (its output
    replaced by zeros or its mean); with the layer units ``skip`` (the block returns its input) and ``heads`` (every
    head of the layer masked)."""

    name: str = "uniform"
    exclude_special: bool = False
    special_ids: tuple[int, ...] = ()
    means: Any = None

    head_importance: ClassVar[bool] = True
    default_layer_modes: ClassVar[tuple[str, ...]] = LAYER_MODES
    allowed_layer_modes: ClassVar[tuple[str, ...]] = LAYER_MODES
    HOW: ClassVar[dict[str, str]] = {"uniform": "its attention set to 1/L over the tokens{special}",
                                     "zero": "its output zeroed",
                                     "mean": "its output replaced by its mean over the examples"}

    @property
    def words(self) -> Words:  # type: ignore[override]
        return replace(REMOVE, how=self.HOW.get(self.name, self.name))

    def takes(self) -> str:
        return f"{', '.join(HEAD_MASKS[:-1])} and {HEAD_MASKS[-1]} take"

    def units(self, model: torch.nn.Module, sweep: SweepPlan = SweepPlan()) -> list[Unit]:
        return plan_units(sites.num_layers(model), sites.num_heads(model), layers=sweep.layers, heads=sweep.heads,
                          layer_modes=sweep.layer_modes)[1:]

    def apply(self, model: torch.nn.Module, unit: Unit) -> AbstractContextManager[None]:
        if unit.layer_mode == "skip":
            return skip_layers(model, [unit.layer])
        heads = [(unit.layer, unit.head)] if unit.target == "head" else [
            (unit.layer, h) for h in range(sites.num_heads(model))]
        return ablate_head_groups(model, [heads], self.name, exclude_special=self.exclude_special,
                                  special_ids=self.special_ids, means=self.means)

    def scoring_mode(self) -> str:
        return self.name

    def sweep(self, model: torch.nn.Module, encoded, label_ids, scoring: HeadScoring, **run) -> AblationResult:
        """The batched head sweep (:func:`~bertology.experiments.ablation_sweep.run_ablation`)."""
        return run_ablation(model, encoded, label_ids, scoring, **run)


@dataclass(frozen=True)
class Revert(Intervention):
    """One unit of the tuned model put back to the base model's weights (Tamkin et al. 2020): every head, every
    layer's attention block, feed-forward block and whole layer, and the embeddings."""

    base: torch.nn.Module | None = field(default=None, compare=False)
    name: str = "revert"

    section: ClassVar[str] = "revert"
    needs_base: ClassVar[bool] = True
    words: ClassVar[Words] = REVERT_WORDS
    default_layer_modes: ClassVar[tuple[str, ...]] = REVERT_UNITS
    allowed_layer_modes: ClassVar[tuple[str, ...]] = REVERT_UNITS
    delta_note: ClassVar[str] = ("reverted minus intact (the tuned model); helps = ci_low > 0 where higher is better, "
                                 "ci_high < 0 where lower is")

    def bound(self, base: torch.nn.Module | None) -> Revert:
        super().bound(base)
        return replace(self, base=base)

    def plan(self, model: torch.nn.Module, sweep: SweepPlan) -> tuple[list[Unit], str | None]:
        return plan_revert_units(model, layers=sweep.layers, heads=sweep.heads, units=sweep.layer_modes)

    def units(self, model: torch.nn.Module, sweep: SweepPlan = SweepPlan(layer_modes=REVERT_UNITS)) -> list[Unit]:
        return self.plan(model, sweep)[0][1:]

    def apply(self, model: torch.nn.Module, unit: Unit) -> AbstractContextManager[None]:
        return reverted(model, self.base, unit_of(model, unit))

    def start(self, model: torch.nn.Module, unit: Unit) -> int:
        return first_layer(model, [] if unit.target == "intact" else piece_names(unit_of(model, unit)))

    def prepare(self, model: torch.nn.Module, scoring: HeadScoring) -> None:
        check_base(model, self.base)
        self.base.to(torch.device(scoring.device)).eval()

    def fingerprint(self) -> dict[str, Any]:
        return {"base": base_fingerprint(self.base)}

    def fingerprint_params(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        return {"base_fingerprint": settings["base"]}

    def plan_params(self, sweep: SweepPlan) -> dict[str, Any]:
        units = [u for u in REVERT_UNITS if u in sweep.layer_modes]
        return {"layer_modes": units, "layer_mode_names": {u: f"{self.name}_{u}" for u in units}}


@dataclass(frozen=True)
class Transplant(Intervention):
    """The base encoder under the tuned head plus one tuned unit, or the top/bottom k tuned layers: how much of the
    fine-tuning gain a unit carries (its own table, ``transplant``)."""

    base: torch.nn.Module | None = field(default=None, compare=False)
    name: str = "transplant"

    table: ClassVar[str] = TRANSPLANT_TABLE
    columns: ClassVar[tuple[str, ...]] = tuple(TRANSPLANT_COLUMNS)
    section: ClassVar[str] = "transplant"
    needs_base: ClassVar[bool] = True
    words: ClassVar[Words] = replace(REVERT_WORDS, verb="transplant", noun="transplant", participle="transplanted")

    def layer_modes(self, given: Sequence[str]) -> tuple[str, ...]:
        """None: its units are fixed (embeddings, layer, attention, ffn; heads by ``--transplant-heads``)."""
        if tuple(given) not in (LAYER_MODES, ()):
            raise BertologyError("--layer-modes (layer_modes) cannot go with --mode transplant: it transplants the "
                                 "embeddings, every layer, attention and feed-forward block (heads: --transplant-heads).")
        return ()

    def bound(self, base: torch.nn.Module | None) -> Transplant:
        super().bound(base)
        return replace(self, base=base)

    def units(self, model: torch.nn.Module, sweep: SweepPlan = SweepPlan()) -> list:
        """The transplant table's row groups (:class:`~bertology.experiments.transplant_sweep.Row`)."""
        from bertology.experiments.transplant_sweep import plan_transplant

        return plan_transplant(model, layers=sweep.layers, heads=sweep.heads)[0]

    def apply(self, model: torch.nn.Module, unit) -> AbstractContextManager[None]:
        from bertology.models.transplant import transplanted

        return transplanted(model, self.base, unit.parts)

    def study(self, model, encoded, label_ids, scoring: HeadScoring, settings, partial: Path | None, on_progress):
        """Its own table and manifest summary (:func:`~bertology.experiments.transplant_study.run_transplant_study`)."""
        from bertology.experiments.transplant_study import run_transplant_study

        return run_transplant_study(model, self.base, encoded, label_ids, scoring, settings, partial, on_progress)

    def summary(self, tables: Mapping[str, Any], note: str = "") -> str:
        from bertology.experiments.transplant_study import summary

        return summary(tables, note)


ERASE_WORDS = Words(
    "erase", "erasure", "Erasures", "Erased", "erased", "erased ({mode})", "layer's property is erased",
    "Layer whose erasure the task feels most", "erased (LEACE)", "erasure",
    "the property LEACE-erased from that hidden state",
    lede=("What the tuned model's own task loses when a word property the probes read (its part of speech, say) is "
          "erased from one layer with LEACE (Belrose et al. 2023; the question of Elazar et al. 2021): the eraser, "
          "fitted on the tuned model's word vectors of the probe's training words, is applied to every position of "
          "that hidden state, one layer at a time. The change in {metrics} is measured on the same examples, with 95% "
          "intervals from a paired bootstrap; a drop says the task uses what the probe reads there. The token probes' "
          "erased accuracy, on the majority rate, is the check that the property is gone."),
    layer_caption="Change in {what} when the property is LEACE-erased from one layer (0: the embeddings' output)")


@dataclass(frozen=True)
class Erase(Intervention):
    """A word property LEACE-erased (Belrose et al. 2023) from one hidden state, at every position: one unit per
    layer with an eraser (0 = the embeddings' output), fitted by the token probes on that model's word vectors
    (:mod:`bertology.experiments.erasure`). Run by ``bertology probe --erase TASK --erase-task-data FILE``: what the
    model's own task loses when the property is gone from that layer."""

    erasers: Mapping[int, Any] = field(default_factory=dict, compare=False)
    concept: str = ""
    name: str = "erase"

    words: ClassVar[Words] = ERASE_WORDS
    delta_note: ClassVar[str] = ("erased minus intact; helps = ci_low > 0 where higher is better, ci_high < 0 where "
                                 "lower is")

    def units(self, model: torch.nn.Module, sweep: SweepPlan = SweepPlan()) -> list[Unit]:
        return [Unit("layer", layer=int(layer), layer_mode="erase") for layer in sorted(self.erasers)
                if sweep.layers is None or int(layer) in sweep.layers]

    def apply(self, model: torch.nn.Module, unit: Unit) -> AbstractContextManager[None]:
        from bertology.experiments.erasure import erasing

        return erasing(model, unit.layer, self.erasers[unit.layer])

    def start(self, model: torch.nn.Module, unit: Unit) -> int:
        """Block ``l`` runs (its output is the erased hidden state ``l``); layer 0 (the embeddings' output): a full
        forward."""
        if unit.target == "intact":
            return sites.num_layers(model) + 1
        own = unit.layer >= 1 and sites.hidden_output(model, unit.layer) is sites.block(model, unit.layer)
        return unit.layer if own else 0

    def fingerprint(self) -> dict[str, Any]:
        import hashlib

        digest = hashlib.sha256()
        for layer in sorted(self.erasers):
            e = self.erasers[layer]
            for t in (e.proj_left, e.proj_right, *(() if e.bias is None else (e.bias,))):
                digest.update(t.detach().cpu().to(torch.float64).numpy().tobytes())
        return {"concept": self.concept, "erasers": digest.hexdigest()[:16]}

    def fingerprint_params(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        return {"concept": self.concept, "erasure": "LEACE (concept-erasure)", "paper": "Belrose et al. 2023"}

    def plan_params(self, sweep: SweepPlan) -> dict[str, Any]:
        return {"layer_modes": ["erase"], "layers_erased": sorted(int(x) for x in self.erasers)}


#: The head masks' names, in the CLI's order.
HEAD_MASKS = ("uniform", "zero", "mean")
#: Every intervention by the name the CLI gives it (``--mode``, ``--ablation-mode``; ``config.ABLATION_MODES``).
INTERVENTIONS: dict[str, Intervention] = {
    **{name: HeadMask(name) for name in HEAD_MASKS},
    "revert": Revert(),
    "transplant": Transplant(),
}
REVERT, TRANSPLANT = INTERVENTIONS["revert"], INTERVENTIONS["transplant"]


def intervention(name: str) -> Intervention:
    """The registered intervention called ``name`` (one line naming the choices otherwise)."""
    try:
        return INTERVENTIONS[str(name)]
    except KeyError:
        raise BertologyError(f"The ablation mode must be one of {', '.join(INTERVENTIONS)}, not {name!r}.") from None


#: Interventions another command runs (their units need what that command fits), by the name their rows carry.
RUN_ELSEWHERE: dict[str, Intervention] = {"erase": Erase()}


def words_of(name: str) -> Words:
    """The words of the intervention called ``name``; a name no registry knows reads as a removal."""
    known = INTERVENTIONS.get(str(name)) or RUN_ELSEWHERE.get(str(name))
    return known.words if known is not None else REMOVE


@contextmanager
def registered(extra: Intervention) -> Iterator[Intervention]:
    """``extra`` in the registry for the length of a ``with`` block (tests, plug-ins trying one out)."""
    had = INTERVENTIONS.get(extra.name)
    INTERVENTIONS[extra.name] = extra
    try:
        yield extra
    finally:
        if had is None:
            del INTERVENTIONS[extra.name]
        else:
            INTERVENTIONS[extra.name] = had


def run_revert(model: torch.nn.Module, base: torch.nn.Module, encoded, label_ids, scoring: HeadScoring = HeadScoring(),
               **run) -> AblationResult:
    """The revert sweep (:class:`Revert` through :func:`run_intervention`); ``run``: its keywords (``sweep`` default:
    every revert unit)."""
    run.setdefault("sweep", SweepPlan(layer_modes=REVERT_UNITS))
    return Revert(base).sweep(model, encoded, label_ids, scoring, **run)
