"""attention_targets on tiny models: equal to a slow per-sentence loop, partitions, identity, merge."""
import math
import unicodedata

import numpy as np
import pytest
import torch

from bertology.activations.extract import run_analyses
from bertology.analyses.attention_targets import AttentionTargets, is_punct_token
from bertology.data.corpus import Corpus, Example
from bertology.data.encode import EncodedCorpus, encode_corpus
from bertology.errors import BertologyError
from bertology.models.pair import ModelPair
from bertology.testing import SENTENCES, TINY_WORDS

torch.set_num_threads(1)

# Hand-annotated examples, words from TINY_WORDS (+ "cats"/"reading": two pieces each) and punctuation.
ANNOTATED = [
    Example(
        "i did not like the movie .",
        words=("i", "did", "not", "like", "the", "movie", "."),
        upos=("PRON", "AUX", "PART", "VERB", "DET", "NOUN", "PUNCT"),
        heads=(4, 4, 4, 0, 6, 4, 4),
        deprels=("nsubj", "aux", "neg", "root", "det", "dobj", "punct"),
    ),
    Example(
        "john saw cats reading a book , mary ran !",
        words=("john", "saw", "cats", "reading", "a", "book", ",", "mary", "ran", "!"),
        upos=("PROPN", "VERB", "NOUN", "VERB", "DET", "NOUN", "PUNCT", "PROPN", "VERB", "PUNCT"),
        heads=(2, 0, 2, 3, 6, 4, 2, 9, 2, 2),
        deprels=("nsubj", "root", "obj", "acl", "det", "obj", "punct", "nsubj", "conj", "punct"),
    ),
    Example(
        "no dog sat",
        words=("no", "dog", "sat"),
        upos=("DET", "NOUN", "VERB"),
        heads=(2, 3, 0),
        deprels=("det", "nsubj", "root"),
    ),
    Example(
        "she gave him nothing .",  # "him" is not in the tiny vocab: one [UNK] word
        words=("she", "gave", "him", "nothing", "."),
        upos=("PRON", "VERB", "PRON", "PRON", "PUNCT"),
        heads=(2, 0, 2, 2, 2),
        deprels=("nsubj", "root", "iobj", "dobj", "punct"),
    ),
]
UNANNOTATED = [
    Example("the cat sat on the mat ."),
    Example("a good film", text_pair="it was fun ."),
]
CORPUS = Corpus(ANNOTATED + UNANNOTATED)
NEG = {"not", "no", "never", "n't", "nor", "neither", "nobody", "nothing", "none", "nowhere", "without", "cannot"}
WORD_CATS = ("noun", "verb", "pron", "subject", "object", "negation")


def test_corpus_uses_tiny_words():
    vocab = set(TINY_WORDS) | {".", ",", "!", "cats", "reading", "him", "nothing"}
    assert all(w in vocab for ex in ANNOTATED for w in ex.words)


def _run(pair, corpus, batch_size=2, items=None, **kwargs):
    enc = encode_corpus(corpus, pair.tokenizer)
    if items is not None:
        enc = EncodedCorpus([enc.items[i] for i in items], enc.max_length, enc.overlong, enc.n_input)
    a = AttentionTargets(corpus, pair.tokenizer, pair.num_layers, pair.num_heads, **kwargs)
    run_analyses(pair, enc, [a], batch_size=batch_size)
    return a


def _word_cats(ex, w):
    pos, rel, word = ex.upos[w], ex.deprels[w], ex.words[w].lower()
    return {
        "noun": pos in ("NOUN", "PROPN"),
        "verb": pos == "VERB",
        "pron": pos == "PRON",
        "subject": rel in ("nsubj", "nsubj:pass", "nsubjpass", "csubj", "csubj:pass", "csubjpass"),
        "object": rel in ("obj", "dobj", "iobj"),
        "negation": word in NEG or rel == "neg" or (pos == "PART" and word in ("not", "n't")),
    }


def _slow(pair, corpus):
    """{(model, layer, head, target): [sum, count]} with explicit loops, one unpadded sentence at a time."""
    tok = pair.tokenizer
    acc = {}
    L, H = pair.num_layers, pair.num_heads

    def add(key, value):
        s = acc.setdefault(key, [0.0, 0])
        s[0] += value
        s[1] += 1

    for ex in corpus:
        if ex.words is not None:
            enc = tok(ex.text)  # the plain text; its words are the corpus words here
        elif ex.text_pair is not None:
            enc = tok(ex.text, ex.text_pair)
        else:
            enc = tok(ex.text)
        ids = enc["input_ids"]
        tokens = tok.convert_ids_to_tokens(ids)
        word_ids, seq = enc.word_ids(), enc.sequence_ids()
        n = len(ids)
        annotated = ex.upos is not None
        cat_keys = {"cls": [], "sep": [], "punct": [], "other_tokens": []}
        for c in WORD_CATS:
            cat_keys[c] = []
        for k, t in enumerate(tokens):
            if t == "[CLS]":
                cat_keys["cls"].append(k)
            elif t == "[SEP]":
                cat_keys["sep"].append(k)
            elif all(unicodedata.category(ch)[0] == "P" for ch in t.removeprefix("##")):
                cat_keys["punct"].append(k)
            else:
                cat_keys["other_tokens"].append(k)
            if annotated and word_ids[k] is not None and seq[k] == 0:
                for c, yes in _word_cats(ex, word_ids[k]).items():
                    if yes:
                        cat_keys[c].append(k)
        words_of = {}  # word -> its pieces
        for k in range(n):
            if annotated and word_ids[k] is not None and seq[k] == 0:
                words_of.setdefault(word_ids[k], []).append(k)
        in_any = set(cat_keys["cls"] + cat_keys["sep"] + cat_keys["punct"])
        for c in WORD_CATS:
            in_any |= set(cat_keys[c])
        cat_keys["other"] = [k for k in range(n) if k not in in_any]
        inputs = {k: torch.tensor([v]) for k, v in enc.items()}
        for m, model in enumerate((pair.base.model, pair.tuned.model)):
            with torch.inference_mode():
                att = model(**inputs, output_attentions=True).attentions
            for layer in range(1, L + 1):
                for h in range(H):
                    A = att[layer - 1][0, h].double().tolist()
                    key = lambda t: (m, layer, h, t)  # noqa: E731
                    received = [sum(A[q][k] for q in range(n)) / n for k in range(n)]
                    for c in ("cls", "sep", "punct", "other_tokens") + (WORD_CATS if annotated else ()):
                        if cat_keys[c]:
                            add(key(c), sum(A[q][k] for q in range(n) for k in cat_keys[c]) / n)
                    add(key("self"), sum(A[q][q] for q in range(n)) / n)
                    add(key("prev"), sum(A[q][q - 1] for q in range(1, n)) / n)
                    add(key("next"), sum(A[q][q + 1] for q in range(n - 1)) / n)
                    add(key("entropy"), sum(-sum(p * math.log(p) for p in A[q] if p > 0) for q in range(n)) / n)
                    add(key("max_sep"), max(received[k] for k in cat_keys["sep"]))
                    if annotated:
                        for c in WORD_CATS:
                            words = [w for w in range(len(ex.words)) if _word_cats(ex, w)[c] and w in words_of]
                            if words:
                                add(key(f"max_{c}"), max(sum(received[k] for k in words_of[w]) for w in words))
                    if layer == L:
                        assert tokens[0] == "[CLS]"
                        cats = ("cls", "sep", "punct") + (WORD_CATS + ("other",) if annotated else ())
                        for c in cats:
                            if cat_keys[c]:
                                add(key(f"from_cls_{c}"), sum(A[0][k] for k in cat_keys[c]))
    return acc


def test_equals_a_slow_per_sentence_loop(planted_pair):
    pair = ModelPair.load(*map(str, planted_pair))
    a = _run(pair, CORPUS, batch_size=2)  # batches mix lengths: padding must not leak in
    table = a.compute().table
    slow = _slow(pair, CORPUS)
    models = {0: "base", 1: "tuned"}
    got = {(r.model, r.layer, r["head"], r.target): (r.value, r.n) for _, r in table.iterrows()}
    expected = {(models[m], layer, h, t): (s / c, c) for (m, layer, h, t), (s, c) in slow.items()}
    assert set(got) == set(expected)
    for key, (value, n) in expected.items():
        assert got[key][1] == n, key
        assert got[key][0] == pytest.approx(value, abs=1e-6), key
    # the corpus exercises every category, and the n counts what it should
    ns = table.groupby("target").n.first()
    assert ns["cls"] == ns["self"] == ns["entropy"] == len(CORPUS)
    assert ns["punct"] == 5 and ns["negation"] == 3 and ns["object"] == 3
    assert ns["from_cls_other"] == 2  # every word of "no dog sat" and "she gave him nothing ." is in a category
    assert (table.n_examples == len(CORPUS)).all()
    assert set(table[table.target.str.startswith("from_cls_")].layer) == {pair.num_layers}
    assert a.compute().params["n_annotated"] == len(ANNOTATED)


def test_token_shares_partition_each_row_and_positions_are_bounded(planted_pair):
    pair = ModelPair.load(*map(str, planted_pair))
    table = _run(pair, CORPUS).compute().table
    wide = table.pivot_table(index=["model", "layer", "head"], columns="target", values="value_all")
    total = wide[["cls", "sep", "punct", "other_tokens"]].sum(axis=1)
    assert np.allclose(total, 1.0, atol=1e-6)
    pos = wide[["self", "prev", "next"]]
    assert ((pos >= 0) & (pos <= 1)).all().all()
    assert (pos.sum(axis=1) <= 1 + 1e-9).all()  # three distinct keys per query
    assert ((wide.entropy > 0) & (wide.entropy <= np.log(20))).all()
    cls_row = wide[["from_cls_cls", "from_cls_sep", "from_cls_punct", "from_cls_other"]].dropna()
    assert (cls_row.sum(axis=1) <= 1 + 1e-9).all()
    # share of a word category <= the content share; max over words <= share of the category
    values = table.pivot_table(index=["model", "layer", "head"], columns="target", values="value")
    for c in WORD_CATS:
        assert (values[f"max_{c}"] <= values[c] + 1e-12).all()
    assert (values["max_sep"] <= values["sep"] + 1e-12).all()


def test_values_partition_when_every_example_has_every_token_category(identical_pair):
    pair = ModelPair.load(*map(str, identical_pair))
    corpus = Corpus.from_list([s for s in SENTENCES if any(p in s for p in ".,!")])
    wide = _run(pair, corpus, batch_size=3).compute().table.pivot_table(
        index=["model", "layer", "head"], columns="target", values="value")
    assert np.allclose(wide[["cls", "sep", "punct", "other_tokens"]].sum(axis=1), 1.0, atol=1e-6)


def test_identical_pair_gives_identical_rows_planted_pair_moves_only_its_head(identical_pair, planted_pair):
    pair = ModelPair.load(*map(str, identical_pair))
    t = _run(pair, CORPUS).compute().table
    base = t[t.model == "base"].drop(columns="model").reset_index(drop=True)
    tuned = t[t.model == "tuned"].drop(columns="model").reset_index(drop=True)
    assert base.equals(tuned)
    pair = ModelPair.load(*map(str, planted_pair))
    t = _run(pair, CORPUS).compute().table
    w = t.pivot_table(index=["target", "layer", "head"], columns="model", values="value")
    diff = (w.base - w.tuned).abs().groupby(["layer", "head"]).max()
    assert diff.loc[(2, 1)] > 0.01
    assert diff.drop(index=(2, 1)).max() < 1e-6


def test_merge_of_shards_equals_the_whole(planted_pair):
    pair = ModelPair.load(*map(str, planted_pair))
    whole = _run(pair, CORPUS, batch_size=4)
    first = _run(pair, CORPUS, items=[0, 2, 5], batch_size=2)
    second = _run(pair, CORPUS, items=[1, 3, 4], batch_size=1)
    merged = first.merge(second)
    assert merged.n_examples == whole.n_examples and merged.n_annotated == whole.n_annotated
    assert (merged.counts == whole.counts).all()
    a, b = merged.compute().table, whole.compute().table
    assert a[["model", "layer", "head", "target", "n"]].equals(b[["model", "layer", "head", "target", "n"]])
    assert np.allclose(a.value, b.value, atol=1e-12)
    with pytest.raises(ValueError):
        merged.merge(AttentionTargets(CORPUS, pair.tokenizer, pair.num_layers, pair.num_heads, word_level=False))


def test_without_annotations_or_word_level_word_targets_are_skipped(identical_pair):
    pair = ModelPair.load(*map(str, identical_pair))
    res = _run(pair, Corpus.from_list(SENTENCES[:4])).compute()
    assert not res.table.target.isin(WORD_CATS).any()
    assert "word_level_note" in res.params and res.params["n_annotated"] == 0
    res = _run(pair, CORPUS, word_level=False).compute()
    assert not res.table.target.isin(WORD_CATS + ("max_noun", "from_cls_noun")).any()
    # without word categories, "other" is every key that is not [CLS], [SEP] or punctuation
    w = res.table[res.table.target.str.startswith("from_cls_")].pivot_table(
        index=["model", "head"], columns="target", values="value_all")
    assert np.allclose(w.sum(axis=1), 1.0, atol=1e-6)
    assert (res.table[res.table.target == "entropy"].unit == "nats").all()


def test_custom_negation_words_and_mismatched_corpus(identical_pair):
    pair = ModelPair.load(*map(str, identical_pair))
    corpus = Corpus(ANNOTATED[:1])
    t = _run(pair, corpus, negation_words=("movie",)).compute().table
    t_default = _run(pair, corpus).compute().table
    # "not" still counts (deprel neg), "movie" is now a negation word too: more attention
    sel = lambda tab: tab[(tab.target == "negation")].value.to_numpy()  # noqa: E731
    assert (sel(t) > sel(t_default)).all()
    enc = encode_corpus(corpus, pair.tokenizer)
    short = Corpus([Example("i", words=("i",), upos=("PRON",), heads=(0,), deprels=("root",))])
    a = AttentionTargets(short, pair.tokenizer, pair.num_layers, pair.num_heads)
    with pytest.raises(BertologyError, match="same corpus"):
        run_analyses(pair, enc, [a])


@pytest.mark.parametrize(
    ("token", "expected"),
    [(".", True), (",", True), ("##!", True), ("...", True), ("\u00bf", True), ("\u2581,", True), ("$", False),
     ("a.", False), ("##", False), ("[SEP]", False), ("", False)],
)
def test_is_punct_token(token, expected):
    assert is_punct_token(token) is expected


def test_sentence_pair_words_count_in_both_texts_when_both_are_annotated(identical_pair):
    """A noun only in the second text is a target when the pair's annotations cover both texts."""
    pair = ModelPair.load(*map(str, identical_pair))
    both = Example("i ran", text_pair="the dog sat", words=("i", "ran", "the", "dog", "sat"),
                   upos=("PRON", "VERB", "DET", "NOUN", "VERB"), heads=(2, 0, 4, 5, 0),
                   deprels=("nsubj", "root", "det", "nsubj", "root"), n_first_words=2)
    first_only = Example("i ran", text_pair="the dog sat", words=("i", "ran"), upos=("PRON", "VERB"),
                         heads=(2, 0), deprels=("nsubj", "root"))
    a_both = _run(pair, Corpus([both]))
    a_first = _run(pair, Corpus([first_only]))
    t_both, t_first = a_both.compute().table, a_first.compute().table
    assert "noun" in set(t_both.target) and "noun" not in set(t_first.target)
    # the pronoun of the first text counts either way, with the same value (same tokens, same maps)
    p_both = t_both[t_both.target == "pron"].sort_values(["model", "layer", "head"]).value.to_numpy()
    p_first = t_first[t_first.target == "pron"].sort_values(["model", "layer", "head"]).value.to_numpy()
    np.testing.assert_allclose(p_both, p_first, atol=1e-12)
    # the noun's share equals the attention its pieces receive, from a direct computation
    enc = encode_corpus(Corpus([both]), pair.tokenizer)
    it = enc.items[0]
    dog = np.flatnonzero((it.segment == 1) & (it.word_ids == 1))
    with torch.inference_mode():
        out = pair.base.model(input_ids=torch.from_numpy(it.input_ids[None]), token_type_ids=torch.from_numpy(it.token_type_ids[None]),
                              output_attentions=True)
    expect = out.attentions[0][0, :, :, dog].sum(-1).mean(-1).double().numpy()  # layer 1, per head
    got = t_both[(t_both.target == "noun") & (t_both.model == "base") & (t_both.layer == 1)].sort_values("head").value
    np.testing.assert_allclose(got.to_numpy(), expect, atol=1e-6)


def test_punctuation_lookup_equals_is_punct_token_and_grows():
    from bertology.analyses.attention_targets import PunctuationLookup
    from bertology.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    lookup = PunctuationLookup(tok)
    ids = np.array([[tok.cls_token_id, *tok.convert_tokens_to_ids([".", "the", ","]), tok.sep_token_id]])
    expected = [is_punct_token(t) for t in tok.convert_ids_to_tokens(ids[0].tolist())]
    assert lookup(ids[:, :2]).tolist() == [expected[:2]]  # a first batch with small ids only
    assert lookup(ids).tolist() == [expected]
    assert expected.count(True) == 2
