"""Per-task recipes: the defaults each task head trains with unless the user gives a value.

One table (:data:`RECIPES`) says, per task, the encoder's and the head's learning rate, the epochs, the
batch size, the warm-up and (for the parser) the biaffine sizes, each with where the value comes from
(a paper, or a measurement here: ``benchmarks/recipes.py``, docs/results/recipes.md). The settings
these fill are declared once in :class:`~bertology.config.FinetuneConfig` with ``None`` = "the task's
recipe", so a value the user gave, even one equal to another task's default, is never overridden:
:func:`apply_recipe` fills only what is still ``None`` and records which settings it filled.

A recipe also carries the held-out figure it reached here (:class:`Reference`); a run that ends far
below it, or with its training loss still falling steeply, gets a warning in its manifest
(:func:`undertraining_warnings`), so an under-trained model is flagged before it is analysed.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from bertology.config import FinetuneConfig

#: The settings a recipe fills (FinetuneConfig fields whose default is None = "the task's recipe").
RECIPE_SETTINGS = ("learning_rate", "head_lr", "epochs", "batch_size", "warmup_ratio", "arc_dim", "label_dim")
#: The generic fine-tuning defaults bertology used for every task before recipes (Devlin et al. 2019's range).
GENERIC = "Devlin et al. 2019 (bertology's generic defaults before per-task recipes)"
#: A run whose training loss fell by more than this share over its last epoch is still learning fast.
STEEP_DROP = 0.25
#: A run whose primary metric is below this share of its recipe's reference figure is far below it.
FAR_BELOW = 0.85
#: Optimizer steps below which a weak run is told to train longer: few-sample fine-tuning fails from too few
#: updates rather than too few examples (Mosbach et al. 2021). Measured here: ``benchmarks/small_data.py``.
MIN_STEPS = 100
#: How :func:`no_reference_note` begins: a note, not a sign that the run is weak.
NO_REFERENCE = "No reference figure for "


@dataclass(frozen=True)
class Reference:
    """The held-out figure a recipe reached here: ``metric`` = ``value`` on ``what`` (model, data, how measured);
    ``dataset``: the dataset it was measured on, as :mod:`bertology.tasks.main_metric` names it (None: none of those)."""

    metric: str
    value: float
    what: str
    dataset: str | None = None

    def applies_to(self, metric: str | None, dataset: str | None) -> bool:
        """Whether a run judged by ``metric`` on ``dataset`` may be compared with this figure: the same metric, and
        the same dataset where the run's is known (None: a run that names neither is compared, as it always was)."""
        return (metric is None or metric == self.metric) and (dataset is None or dataset == self.dataset)


@dataclass(frozen=True)
class Recipe:
    """One task's defaults. ``head_lr`` None: the head trains at the encoder's rate; ``arc_dim``/``label_dim``
    None: the task has no biaffine head. ``sources`` names, per setting, the paper or measurement it follows."""

    learning_rate: float
    epochs: float
    batch_size: int
    warmup_ratio: float
    sources: Mapping[str, str]
    head_lr: float | None = None
    arc_dim: int | None = None
    label_dim: int | None = None
    reference: Reference | None = None
    notes: tuple[str, ...] = field(default=())

    def value(self, name: str, learning_rate: float) -> float | int | None:
        """The recipe's value of setting ``name`` (``head_lr`` None reads as the run's encoder rate)."""
        value = getattr(self, name)
        return learning_rate if name == "head_lr" and value is None else value


_GENERIC_SOURCES = {"learning_rate": GENERIC, "head_lr": "the encoder's rate (one rate, as Devlin et al. 2019)",
                    "epochs": GENERIC, "batch_size": GENERIC, "warmup_ratio": GENERIC}

#: Every task's recipe, by the task's name (``bio_tagging`` trains with ``tagging``'s).
RECIPES: dict[str, Recipe] = {
    "classification": Recipe(
        learning_rate=5e-5, epochs=2.0, batch_size=32, warmup_ratio=0.1, sources=_GENERIC_SOURCES,
        reference=Reference("accuracy", 0.848, "minilm, SST-2: a 4,000-sentence sample of train -> dev "
                            "(benchmarks/recipes.py)", dataset="SST-2")),
    "regression": Recipe(
        learning_rate=1e-4, head_lr=1e-3, epochs=2.0, batch_size=16, warmup_ratio=0.1,
        sources={"learning_rate": "measured here: STS-B, Pearson .845 vs .804 at the generic 5e-5, batch 32 "
                                  "(docs/results/recipes.md)",
                 "head_lr": "measured here, with --lr (the tagger's)", "epochs": GENERIC,
                 "batch_size": "measured here, with --lr (the tagger's)", "warmup_ratio": GENERIC},
        reference=Reference("pearson", 0.845, "minilm, STS-B: a 2,000-pair sample of train, 20% held out "
                            "(benchmarks/recipes.py)", dataset="STS-B")),
    "tagging": Recipe(
        learning_rate=1e-4, head_lr=1e-3, epochs=2.0, batch_size=16, warmup_ratio=0.1,
        sources={"learning_rate": "chosen here: twice the generic rate, as the parser's (docs/results/recipes.md)",
                 "head_lr": "chosen here: 10x the encoder's, half the parser's (docs/results/recipes.md)",
                 "epochs": GENERIC, "batch_size": "chosen here: twice the steps of batch 32 (docs/results/recipes.md)",
                 "warmup_ratio": GENERIC},
        reference=Reference("accuracy", 0.948, "minilm, UD EWT dev -> test, UPOS (benchmarks/recipes.py)")),
    "parsing": Recipe(
        learning_rate=1e-4, head_lr=2e-3, epochs=2.0, batch_size=4, warmup_ratio=0.1, arc_dim=500, label_dim=100,
        sources={"learning_rate": "chosen from short runs: 1e-4 at batch 4 beat 2e-4 at batch 8 (docs/results/recipes.md)",
                 "head_lr": "Dozat & Manning 2017 (Adam at 2e-3)",
                 "epochs": "the recipes' time budget: 2 epochs (docs/results/recipes.md)",
                 "batch_size": "measured here: short runs, batch 4 > 8 > 16 (docs/results/recipes.md)",
                 "warmup_ratio": GENERIC,
                 "arc_dim": "Dozat & Manning 2017", "label_dim": "Dozat & Manning 2017"},
        reference=Reference("uas", 0.857, "minilm, UD EWT dev -> test, one-root trees (benchmarks/recipes.py)")),
    "qa": Recipe(
        learning_rate=5e-5, epochs=2.0, batch_size=32, warmup_ratio=0.1, sources=_GENERIC_SOURCES,
        notes=("not tuned here: no SQuAD-format data is available offline",)),
    "contrastive": Recipe(
        learning_rate=5e-5, epochs=2.0, batch_size=32, warmup_ratio=0.1, sources=_GENERIC_SOURCES,
        notes=("SimCSE (Gao et al. 2021) trains 1 epoch at 3e-5, batch 64, on 10^6 Wikipedia sentences (recalled "
               "from the paper, not re-checked); not adopted: not measured here on the data sizes bertology's users bring",)),
}


#: The encoder's (the adapters') learning rate of a LoRA run (``--method lora``) when none is given: LoRA trains few
#: weights from a zero update and wants a higher rate than full fine-tuning.
LORA_LEARNING_RATE = 5e-4
LORA_SOURCE = ("Hu et al. 2021 (LoRA on RoBERTa-base, GLUE: about 5e-4; recalled from the paper, not re-checked; "
               "not measured here)")


def recipe_for(task: str, method: str = "full") -> Recipe:
    """The recipe of ``task`` (``bio_tagging`` is ``tagging``'s); with ``method="lora"`` its learning rate is
    :data:`LORA_LEARNING_RATE` (the head's rate stays the task's, or follows the encoder's where the task has none)."""
    recipe = RECIPES["tagging" if task == "bio_tagging" else task]
    if method != "lora":
        return recipe
    return dataclasses.replace(recipe, learning_rate=LORA_LEARNING_RATE,
                               sources={**recipe.sources, "learning_rate": LORA_SOURCE},
                               notes=(*recipe.notes, "--method lora: the learning rate is LoRA's (Hu et al. 2021), the "
                                      "reference figure the full fine-tune's"))


def apply_recipe(config: FinetuneConfig, task: str) -> FinetuneConfig:
    """``config`` with every recipe setting still ``None`` filled from ``task``'s recipe, and ``config.recipe``
    naming the task and the settings filled (values the user gave are kept: they are not None)."""
    recipe = recipe_for(task, config.method)
    lr = config.learning_rate if config.learning_rate is not None else recipe.learning_rate
    filled = {name: recipe.value(name, lr) for name in RECIPE_SETTINGS if config.value(name) is None}
    filled = {name: value for name, value in filled.items() if value is not None}
    if not filled:
        return config
    before = (config.recipe or {}).get("from_recipe", [])
    record = {"task": task, "from_recipe": sorted({*before, *filled})}
    return dataclasses.replace(config, **filled, recipe=record)


def recipe_record(config: FinetuneConfig) -> dict | None:
    """The manifest's ``recipe``: the task, each setting the recipe filled with its value and source, and the
    recipe's reference figure (None when no recipe was applied)."""
    if not config.recipe:
        return None
    recipe = recipe_for(config.recipe["task"], config.method)
    ref = recipe.reference
    return {"task": config.recipe["task"],
            "from_recipe": {n: {"value": config.value(n), "source": recipe.sources.get(n, GENERIC)}
                            for n in config.recipe["from_recipe"]},
            "reference": dataclasses.asdict(ref) if ref else None, "notes": list(recipe.notes)}


def recipe_table(task: str) -> str:
    """``task``'s recipe as a markdown table (flag, default, source) plus the figure it reached here: what the
    docs' task pages show (``<!-- bertology-recipe: TASK -->``, docs/hooks/build.py), generated as the flags are."""
    from bertology.settings import field_setting

    recipe = RECIPES[task]
    rows = ["| flag | default for this task | source |", "|---|---|---|"]
    for name in RECIPE_SETTINGS:
        value = getattr(recipe, name)
        if value is None and name != "head_lr":
            continue
        shown = "the encoder's (`--lr`)" if value is None else f"{value:g}"
        rows.append(f"| `{field_setting(FinetuneConfig, name).cli_flag}` | {shown} | "
                    f"{recipe.sources.get(name, GENERIC)} |")
    ref = recipe.reference
    lines = ["\n".join(rows)]
    if ref is not None:
        lines.append(f"At these defaults: {ref.metric} {ref.value:g} on {ref.what}; a run that ends below "
                     f"{FAR_BELOW:.0%} of it, or whose training loss fell by more than {STEEP_DROP:.0%} over its last "
                     "epoch, gets an under-training warning.")
    lines += [f"Note: {n}." for n in recipe.notes]
    return "\n\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Under-training
# --------------------------------------------------------------------------------------------------


def last_epoch_drop(table: pd.DataFrame) -> float | None:
    """The relative fall of the training loss over the last epoch (or the last half of a run under 2 epochs):
    ``1 - mean(last third) / mean(first third)`` of the logged loss windows in that span (thirds, so one noisy
    window decides nothing). None with fewer than 3 logged windows there."""
    loss = table[(table["split"] == "train") & (table["metric"] == "loss")].sort_values("step")
    if "slice" in loss.columns:
        loss = loss[loss["slice"].fillna("all") == "all"]
    if loss.empty:
        return None
    end = float(loss["epoch"].max())
    start = end - 1.0 if end >= 2.0 else end / 2.0
    span = loss[loss["epoch"] > start]["value"].to_numpy(np.float64)
    if len(span) < 3:
        return None
    third = len(span) // 3
    first, last = span[:third].mean(), span[-third:].mean()
    return float(1.0 - last / first) if first > 0 else None


def undertraining_warnings(table: pd.DataFrame, metrics: Mapping, task: str | None, *, metric: str | None = None,
                           dataset: str | None = None, steep: float = STEEP_DROP, far: float = FAR_BELOW) -> list[str]:
    """Warnings for a run that ended under-trained: its training loss still falling steeply over the last epoch
    (:func:`last_epoch_drop` above ``steep``), or its held-out main metric below ``far`` times its recipe's
    reference figure (the figure was measured on the recipe's reference data; other data may score otherwise).

    ``metric`` and ``dataset`` are the run's main metric and the dataset that named it (``mcc``, ``CoLA``;
    :mod:`bertology.tasks.main_metric`): a run is compared only with a figure of the same metric and, where its
    dataset is known, the same dataset. Where the recipe has a figure but none of those, the list says there is no
    reference figure for the run instead (never another dataset's figure). None for both: the recipe's figure."""
    out = []
    drop = last_epoch_drop(table)
    if drop is not None and drop > steep:
        out.append(f"The training loss was still falling steeply when the run ended ({drop:.0%} lower at the end of "
                   f"the last epoch than at its start; threshold {steep:.0%}): the model is likely under-trained. "
                   "Train longer (--epochs) or at a higher learning rate before reading its analyses as what "
                   "fine-tuning taught it.")
    ref = RECIPES[task].reference if task in RECIPES else None  # not bio_tagging: its accuracy counts O tags
    if ref is not None and not ref.applies_to(metric, dataset):
        out.append(no_reference_note(task, metric or ref.metric, dataset))
        return out
    value = metrics.get(ref.metric) if ref is not None else None
    if isinstance(value, (int, float)) and np.isfinite(value) and value < far * ref.value:
        out.append(f"The held-out {ref.metric} {value:.3f} is far below what the {task} recipe reaches "
                   f"({ref.value:.3f} on {ref.what}; warning below {far:.0%} of it): the model may be under-trained "
                   "(or the data much harder) before its analyses are read as what fine-tuning taught it.")
    return out


def few_steps_note(schedule: Mapping, *, min_steps: int = MIN_STEPS) -> str | None:
    """For a run already warned of (at chance, one class, under-trained): what it would take, when it made fewer than
    ``min_steps`` optimizer steps — the epochs that reach them on its data, or the examples at its epochs.

    ``schedule``: the run's record (``steps``, ``steps_per_epoch``, ``epochs``, ``effective_batch_size``,
    ``n_train``); None when it made enough steps or the record lacks them."""
    steps, per_epoch = schedule.get("steps"), schedule.get("steps_per_epoch")
    epochs, batch, n_train = schedule.get("epochs"), schedule.get("effective_batch_size"), schedule.get("n_train")
    if not all(isinstance(v, (int, float)) and v > 0 for v in (steps, per_epoch, epochs, batch, n_train)):
        return None
    if steps >= min_steps:
        return None
    epochs_needed = math.ceil(min_steps / per_epoch)
    examples_needed = math.ceil(min_steps * batch / epochs)
    return (f"The run made {steps} optimizer steps ({n_train:,} training examples, batch {batch}, {epochs:g} epochs), "
            f"fewer than {min_steps}: on a few hundred examples more updates, not more data, is what helped here "
            f"(benchmarks/small_data.py: 400 polarity sentences, 26 -> 130 steps took held-out accuracy .693 -> .779; "
            f"Mosbach et al. 2021): train for --epochs {epochs_needed} on this data, or give at least "
            f"{examples_needed:,} training examples at these settings.")


def no_reference_note(task: str | None, metric: str, dataset: str | None) -> str:
    """What the under-training check says of a run no reference figure fits: its held-out score is not judged."""
    of = f"{dataset}'s {metric}" if dataset else metric
    return (f"{NO_REFERENCE}{of}: the {task} recipe was measured on another dataset or metric, so the "
            f"held-out {metric} is not judged for under-training (only the fall of the training loss is).")
