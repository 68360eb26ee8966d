"""The data of a compare run and what is said about it: reading the corpus (and the out-of-domain and user-relation
files), spaCy annotation where an analysis needs trees, the warnings about what was dropped or cut, and the
attention views of a few examples.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bertology.analyses.registry import AnalysisSpec
from bertology.config import CompareConfig, DataConfig
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, encode_corpus
from bertology.errors import BertologyError
from bertology.metrics.trees import tree_problem
from bertology.models.pair import ModelPair
from bertology.results import Result


#: Counts in ``Corpus.stats`` of input rows the loader dropped, and how the report words them.
DROPPED_WHILE_READING = {
    "n_empty_text": "rows with an empty text were dropped",
    "n_no_gold_label": "rows without a gold label ('-') were dropped",
    "n_without_heads": "sentences without dependency heads were read without trees",
}


def load_data(data: DataConfig) -> Corpus:
    """Read the corpus named by a DataConfig (path or hf: spec)."""
    from bertology.data.loaders import load_corpus

    if not data.path:
        raise BertologyError("No data given: pass --data FILE (.txt, .csv, .tsv, .jsonl, .conllu) or hf:NAME:SPLIT.")
    return load_corpus(
        data.path,
        text_column=data.text_column,
        pair_column=data.pair_column,
        label_column=data.label_column,
        limit=data.max_examples,
    )


def load_ood(config: CompareConfig) -> Corpus:
    """The out-of-domain corpus (``--ood-data``), read like ``--data`` with the same example limit."""
    ood = load_data(DataConfig(path=config.ood_data or "", text_column=config.ood_text_column,
                               max_examples=config.data.max_examples, max_length=config.data.max_length,
                               overlong=config.data.overlong))
    if len(ood) == 0:
        raise BertologyError(f"The out-of-domain corpus {config.ood_data} has no examples.")
    return ood


def annotate_if_needed(
    config: CompareConfig, corpus: Corpus, specs: Sequence[AnalysisSpec], warnings: list[str]
) -> tuple[Corpus, tuple[AnalysisSpec, ...]]:
    """Give plain-text corpora POS tags and trees (spaCy) when a selected analysis reads them.

    Returns the corpus and the analyses that can run. Without spaCy, analyses that need trees are
    dropped and those that only use POS tags run without them, with a warning.
    """
    from bertology.data.annotate import annotate

    specs = tuple(specs)
    if not any(spec.needs for spec in specs) or corpus.has_trees:
        return corpus, specs
    try:
        annotated = annotate(corpus, config.spacy_model)
    except BertologyError as err:
        dropped = [s.name for s in specs if "trees" in s.needs]
        warnings.append(f"No POS tags or trees ({err}); word-level targets are skipped"
                        + (f", and so is {', '.join(dropped)}." if dropped else "."))
        return corpus, tuple(s for s in specs if "trees" not in s.needs)
    info = annotated.stats.get("annotated", {})
    warnings.append(
        f"POS tags and dependency trees come from spaCy ({info.get('pipeline', config.spacy_model or 'default')}) "
        "parses, not gold annotations; words are the parser's tokens."
    )
    return annotated, specs


def encoding_warnings(encoded: EncodedCorpus, corpus: Corpus) -> list[str]:
    """What the reader and tokeniser dropped or cut, and doubts about the labels: said once in manifest and report."""
    enc = encoded.describe()
    out = []
    if enc["n_skipped_overlong"]:
        out.append(f"{enc['n_skipped_overlong']} of {enc['n_input']} examples were longer than {enc['max_length']} tokens and were skipped.")
    if enc["n_truncated"]:
        out.append(f"{enc['n_truncated']} of {enc['n_input']} examples were truncated to {enc['max_length']} tokens.")
    out += [f"While reading the data, {corpus.stats[key]} {what}." for key, what in DROPPED_WHILE_READING.items()
            if corpus.stats.get(key)]
    return out + list(corpus.stats.get("label_warnings", []))


def tree_warnings(corpus: Corpus, show: int = 5) -> list[str]:
    """One warning naming the sentences whose dependency heads are not a tree (the probes drop them)."""
    problems = [(i, why) for i, ex in enumerate(corpus, 1) if ex.heads is not None
                and (why := tree_problem(ex.heads, ex.n_first_words)) is not None]
    if not problems:
        return []
    named = "; ".join(f"sentence {i}: {why}" for i, why in problems[:show])
    more = f"; and {len(problems) - show} more" if len(problems) > show else ""
    return [f"{len(problems)} of {len(corpus)} sentences of {corpus.source} have dependency heads that do not "
            f"form one tree, so the structural probes drop them ({named}{more})."]


def load_relations(path: str):
    """The user-given token relations file: (corpus of its texts, relation instances)."""
    from bertology.data.spans import load_span_relations

    return load_span_relations(path)


def check_relation_names(corpus: Corpus, relations) -> None:
    """Refuse, before any extraction, user relation names that are dependency relations of the corpus."""
    deprels = {"all"} | {rel for ex in corpus if ex.deprels for rel in ex.deprels}
    clash = sorted({r.relation for r in relations} & deprels)
    if clash:
        raise BertologyError(
            f"User relation name(s) {', '.join(clash)} are also dependency relations in the data; rename them in the JSONL."
        )


def relations_analysis(config: CompareConfig, pair: ModelPair, spans, max_length: int):
    """The analysis of the user relations and their encoded texts (over-long texts are truncated)."""
    from bertology.analyses.span_relations import SpanRelationHeads

    corpus, relations = spans
    encoded = encode_corpus(corpus, pair.tokenizer, max_length, "truncate")
    return SpanRelationHeads(relations, pair.num_layers, pair.num_heads), encoded


def with_user_relations(treebank: Result | None, user: Result) -> Result:
    """One ``relation_heads`` table: dependency relations (kind "dependency") and user spans (kind "span")."""
    if treebank is None:
        return user
    import pandas as pd

    clash = set(treebank.table.relation) & set(user.table.relation)
    if clash:
        raise BertologyError(
            f"User relation name(s) {', '.join(sorted(clash))} are also dependency relations in the data; rename them in the JSONL."
        )
    user_table = user.table
    if "measure" in treebank.table.columns:  # several attention measures: the user relations are scored on weights
        user_table = user_table.assign(measure="weights")[["measure", *user_table.columns]]
    table = pd.concat([treebank.table, user_table], ignore_index=True)
    return Result(treebank.name, table, {**treebank.params, "user_relations": user.params})


def view_candidates(encoded: EncodedCorpus, n: int, min_tokens: int = 6, max_tokens: int = 24) -> list[int]:
    """Corpus indices of the first ``n`` examples short enough to read in the viewer (corpus order)."""
    return [it.index for it in encoded.items if min_tokens <= len(it) <= max_tokens][:n]


def write_views(run_dir: Path, pair: ModelPair, corpus: Corpus, encoded: EncodedCorpus, n: int, warnings: list[str]) -> list[str]:
    """Interactive attention views (base, tuned, diff) of a few examples, as ``views/example-<i>.json``.

    The report embeds them; each holds both models' attention for every layer and head (about
    0.5 MB for a 24-token sentence in a 6 x 12 model), so only short examples are chosen.
    """
    folder = Path(run_dir) / "views"
    if folder.exists():
        for old in folder.glob("example-*.json"):
            old.unlink()
    return write_view_files(run_dir, pair, corpus, view_candidates(encoded, n), warnings)


def write_view_files(run_dir: Path, pair: ModelPair, corpus: Corpus, indices: Sequence[int], warnings: list[str],
                     what: str = "example") -> list[str]:
    """The attention views of the corpus examples ``indices``, as ``views/example-<i>.json``; their names.

    An example the viewer cannot show (e.g. a text the tokenizer splits differently from its words) is
    left out with a warning naming it (``what``: how the warning calls an example).
    """
    from bertology.results import atomic_write_text
    from bertology.activations.views import compute_view
    from bertology.viz.viewer import json_for_script

    written = []
    for index in indices:
        ex = corpus[index]
        try:
            data = compute_view([pair.base, pair.tuned], ex.text, ex.text_pair)
        except BertologyError as err:
            warnings.append(f"No attention view of {what} {index}: {err}")
            continue
        data["example"] = index
        name = f"views/example-{index}.json"
        atomic_write_text(Path(run_dir) / name, json_for_script(data))
        written.append(name)
    return written
