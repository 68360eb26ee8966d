"""Kovaleva et al. (2019)'s word categories (``word_categories="kovaleva2019"``), pinned against their
notebook's rule written out by hand: target words listed by hand from the tags, relations and their
negation list; their pieces matched by string over the example's tokens; the max over single pieces
of the mean attention they receive; negation averaged over examples where a negation was found, the
other categories over every example."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bertology.activations.extract import run_analyses
from bertology.analyses.attention_targets import AttentionTargets, TargetConventions, kovaleva_target_words
from bertology.config import CompareConfig
from bertology.conventions import resolve
from bertology.data.corpus import Corpus, Example
from bertology.data.encode import encode_corpus
from bertology.models.pair import ModelPair

pytestmark = pytest.mark.usefixtures("one_thread")

CATS = ("noun", "verb", "pron", "subject", "object", "negation")
FIXTURE = [
    Example("i did not like the movie .", words=("i", "did", "not", "like", "the", "movie", "."),
            xpos=("PRP", "VBD", "RB", "VB", "DT", "NN", "."), upos=("PRON", "AUX", "PART", "VERB", "DET", "NOUN", "PUNCT"),
            heads=(4, 4, 4, 0, 6, 4, 4), deprels=("nsubj", "aux", "neg", "root", "det", "dobj", "punct")),
    Example("the dog saw the dogs .", words=("the", "dog", "saw", "the", "dogs", "."),
            xpos=("DT", "NN", "VBD", "DT", "NNS", "."), upos=("DET", "NOUN", "VERB", "DET", "NOUN", "PUNCT"),
            heads=(2, 3, 0, 5, 3, 3), deprels=("det", "nsubj", "root", "det", "dobj", "punct")),
    Example("Not a good film", words=("Not", "a", "good", "film"), xpos=("RB", "DT", "JJ", "NN"),
            upos=("PART", "DET", "ADJ", "NOUN"), heads=(4, 4, 4, 0), deprels=("neg", "det", "amod", "root")),
    Example("the man was notorious", words=("the", "man", "was", "notorious"), xpos=("DT", "NN", "VBD", "JJ"),
            upos=("DET", "NOUN", "AUX", "ADJ"), heads=(2, 4, 4, 0), deprels=("det", "nsubj", "cop", "root")),
    Example("john saw mary", text_pair="she did not", words=("john", "saw", "mary", "she", "did", "not"),
            xpos=("NNP", "VBD", "NNP", "PRP", "VBD", "RB"), upos=("PROPN", "VERB", "PROPN", "PRON", "VERB", "PART"),
            heads=(2, 0, 2, 5, 0, 5), deprels=("nsubj", "root", "dobj", "nsubj", "root", "neg"), n_first_words=3),
]
#: Their target words, read off by hand: PTB tags, spaCy relations, negations as case-sensitive substrings
#: ("Not" is not "not"; "notorious" contains "not").
BY_HAND = [
    {"noun": {"movie"}, "verb": {"did", "like"}, "pron": {"i"}, "subject": {"i"}, "object": {"movie"}, "negation": {"not"}},
    {"noun": {"dog", "dogs"}, "verb": {"saw"}, "pron": set(), "subject": {"dog"}, "object": {"dogs"}, "negation": set()},
    {"noun": {"film"}, "verb": set(), "pron": set(), "subject": set(), "object": set(), "negation": set()},
    {"noun": {"man"}, "verb": {"was"}, "pron": set(), "subject": {"man"}, "object": set(), "negation": {"not"}},
    {"noun": {"john", "mary"}, "verb": {"saw", "did"}, "pron": {"she"}, "subject": {"john", "she"},
     "object": {"mary"}, "negation": {"not"}},
]


def test_target_words_follow_their_tags_relations_and_substring_negations():
    for ex, expected in zip(FIXTURE, BY_HAND):
        assert dict(zip(CATS, map(set, kovaleva_target_words(ex)))) == expected
    assert kovaleva_target_words(Example("no tags", words=("no", "tags"))) is None  # needs xpos and deprels


def test_the_kovaleva2019_preset_sets_their_categories_and_an_explicit_choice_wins():
    assert resolve(CompareConfig()).word_categories == "bertology"
    assert resolve(CompareConfig(conventions="kovaleva2019")).word_categories == "kovaleva2019"
    assert resolve(CompareConfig(conventions="kovaleva2019", word_categories="bertology")).word_categories == "bertology"


def _their_max(pair, ex, targets):
    """[2, L, H] by their notebook: pieces of the target words matched by string, max of the mean column."""
    tok = pair.tokenizer
    enc = tok(ex.text, ex.text_pair) if ex.text_pair else tok(ex.text)
    tokens = tok.convert_ids_to_tokens(enc["input_ids"])
    pieces = [p for w in targets for p in tok.tokenize(w)]
    idx = [i for i, t in enumerate(tokens) if t in pieces]
    out = np.zeros((2, pair.num_layers, pair.num_heads))
    if not idx:
        return out
    inputs = {k: torch.tensor([v]) for k, v in enc.items()}
    for m, model in enumerate((pair.base.model, pair.tuned.model)):
        with torch.inference_mode():
            maps = torch.stack(model(**inputs, output_attentions=True).attentions)[:, 0].double().numpy()
        out[m] = maps.mean(-2)[..., idx].max(-1)  # mean over the query rows, max over the target pieces
    return out


def test_max_categories_equal_their_notebook(planted_pair):
    pair = ModelPair.load(*map(str, planted_pair))
    corpus = Corpus(list(FIXTURE))
    analysis = AttentionTargets(corpus, pair.tokenizer, pair.num_layers, pair.num_heads,
                                conventions=TargetConventions(word_categories="kovaleva2019"))
    run_analyses(pair, encode_corpus(corpus, pair.tokenizer), [analysis], batch_size=2)
    table = analysis.compute().table.sort_values(["model", "layer", "head"])
    for cat in CATS:
        per_example = [_their_max(pair, ex, hand[cat]) for ex, hand in zip(FIXTURE, BY_HAND)]
        rows = table[table.target == f"max_{cat}"]
        if cat == "negation":  # they skip the examples without a negation: our ``value``
            counted = [v for v, hand in zip(per_example, BY_HAND) if hand[cat]]
            got, expected, n = rows["value"], np.mean(counted, axis=0), len(counted)
        else:  # every example counts, 0 where absent: our ``value_all``
            got, expected, n = rows["value_all"], np.mean(per_example, axis=0), sum(bool(h[cat]) for h in BY_HAND)
        np.testing.assert_allclose(got.to_numpy(), expected.reshape(-1), rtol=1e-5, atol=1e-7, err_msg=cat)
        assert set(rows["n"]) == {n}, cat
    # the "notorious" example counts for negation with 0: none of the pieces of "not" is among its tokens
    assert table[table.target == "max_negation"]["n"].iloc[0] == 3
    assert analysis.params()["word_categories"] == "kovaleva2019"

