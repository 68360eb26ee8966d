"""annotate(): spaCy POS/dependency annotations, one unit per example, gold annotations untouched."""
import sys

import pytest

from bertology.data.annotate import annotate, doc_annotations
from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError

spacy = pytest.importorskip("spacy")


def _doc(words, heads, deps, pos, spaces=None):
    from spacy.tokens import Doc
    from spacy.vocab import Vocab

    return Doc(Vocab(), words=words, spaces=spaces, heads=heads, deps=deps, pos=pos)


def test_doc_annotations_two_sentences_are_one_unit_with_two_roots():
    # "Dogs bark . Cats sleep ." ; spaCy heads are absolute token indices, a root is its own head
    doc = _doc(
        ["Dogs", "bark", ".", "Cats", "sleep", "."],
        heads=[1, 1, 1, 4, 4, 4],
        deps=["nsubj", "ROOT", "punct", "nsubj", "ROOT", "punct"],
        pos=["NOUN", "VERB", "PUNCT", "NOUN", "VERB", "PUNCT"],
    )
    words, upos, heads, deprels = doc_annotations(doc)
    assert words == ("Dogs", "bark", ".", "Cats", "sleep", ".")
    assert upos == ("NOUN", "VERB", "PUNCT", "NOUN", "VERB", "PUNCT")
    assert heads == (2, 0, 2, 5, 0, 5)  # second sentence's heads are indices within the example
    assert deprels == ("nsubj", "root", "punct", "nsubj", "root", "punct")


def test_doc_annotations_drop_whitespace_tokens_and_reattach():
    # "a" "\n" "b": b hangs on the whitespace token, which hangs on a
    doc = _doc(["a", "\n", "b"], heads=[0, 0, 1], deps=["ROOT", "dep", "dep"], pos=["NOUN", "SPACE", "NOUN"],
               spaces=[False, False, False])
    words, upos, heads, deprels = doc_annotations(doc)
    assert words == ("a", "b")
    assert heads == (0, 1)
    assert upos == ("NOUN", "NOUN")


class _FakeNLP:
    """Stands in for a pipeline: records what it was asked to parse."""

    def __init__(self):
        from spacy.vocab import Vocab

        self.vocab = Vocab()
        self.meta = {"lang": "xx", "name": "fake", "version": "0"}
        self.seen = []

    def pipe(self, inputs, batch_size=64):
        from spacy.tokens import Doc

        for x in inputs:
            self.seen.append(x)
            words = x.split() if isinstance(x, str) else [t.text for t in x]
            n = len(words)
            yield Doc(self.vocab, words=words, heads=[0] * n, deps=["ROOT"] + ["dep"] * (n - 1), pos=["X"] * n)


def test_gold_examples_unchanged_pairs_annotated_words_reused():
    gold = Example("the cat", words=("the", "cat"), upos=("DET", "NOUN"), heads=(2, 0), deprels=("det", "root"))
    corpus = Corpus(
        [gold, Example("a  dog\tran"), Example("x y", text_pair="z w v"), Example("ignored", words=("my", "words")),
         Example("p", text_pair="q", words=("p",))],
        stats={"keep": 1},
    )
    nlp = _FakeNLP()
    out = annotate(corpus, nlp=nlp)
    assert out.examples[0] is gold
    assert out.examples[1].words == ("a", "dog", "ran")
    assert nlp.seen[0] == "a dog ran"  # whitespace collapsed
    assert out.examples[1].heads == (0, 1, 1)
    pair = out.examples[2]  # both texts parsed apart, then concatenated
    assert pair.words == ("x", "y", "z", "w", "v") and pair.n_first_words == 2
    assert pair.heads == (0, 1, 0, 3, 3)  # the second text's heads point past the first's words
    assert "x y" in nlp.seen and "z w v" in nlp.seen
    assert out.examples[3].words == ("my", "words")  # given words are parsed, not re-tokenised
    assert out.examples[4].heads is None  # a pair with words but no split point is left alone
    assert out.stats["keep"] == 1
    info = out.stats["annotated"]
    assert (info["n_kept"], info["n_parsed"], info["n_pairs_parsed"], info["n_pairs_not_annotated"]) == (1, 2, 1, 1)
    assert corpus.examples[1].words is None  # input untouched


def test_nothing_to_parse_needs_no_spacy_pipeline():
    gold = Example("a", words=("a",), upos=("DET",), heads=(0,), deprels=("root",))
    out = annotate(Corpus([gold]), nlp_name="no_such_pipeline_xyz")
    assert out.examples == [gold]


def test_missing_pipeline_or_spacy_gives_an_actionable_error(monkeypatch):
    with pytest.raises(BertologyError, match="pip install"):
        annotate(Corpus.from_list(["a b"]), nlp_name="no_such_pipeline_xyz")
    monkeypatch.setitem(sys.modules, "spacy", None)
    with pytest.raises(BertologyError, match="spaCy, which is not installed"):
        annotate(Corpus.from_list(["a b"]))


@pytest.mark.real
def test_real_spacy_pipeline():
    from bertology.assets import spacy_model_name

    if spacy_model_name() is None:
        pytest.skip("no English spaCy pipeline installed")
    corpus = Corpus.from_list(["I did not like the movie.", "John saw Mary. She smiled.", "The cat sat on the mat."])
    out = annotate(corpus)
    for ex in out:
        n = len(ex.words)
        assert len(ex.upos) == len(ex.heads) == len(ex.deprels) == n
        assert all(0 <= h <= n for h in ex.heads)
        assert all((h == 0) == (d == "root") for h, d in zip(ex.heads, ex.deprels))
    first = out.examples[0]
    assert first.words == ("I", "did", "not", "like", "the", "movie", ".")
    assert first.deprels[first.words.index("not")] == "neg"
    assert first.deprels[0] == "nsubj" and first.upos[5] == "NOUN"
    assert first.heads[0] == first.words.index("like") + 1
    two = out.examples[1]
    assert two.heads.count(0) == 2  # two sentences, one unit: two roots
    she = two.words.index("She")
    assert two.heads[she] == two.words.index("smiled") + 1  # index within the example, not the sentence
    assert out.stats["annotated"]["n_parsed"] == 3


@pytest.mark.real
def test_a_pipeline_is_loaded_once_per_process_and_parses_as_a_fresh_one():
    from bertology.assets import spacy_model_name
    from bertology.data.annotate import load_spacy

    name = spacy_model_name()
    if name is None:
        pytest.skip("no English spaCy pipeline installed")
    corpus = Corpus.from_list(["I did not like the movie.", "John saw Mary. She smiled."])
    shared = load_spacy(name)
    assert load_spacy(name) is shared and load_spacy() is shared  # the default name is the same pipeline
    used = [annotate(corpus).examples for _ in range(2)]  # through the shared pipeline, twice
    fresh = annotate(corpus, nlp=spacy.load(name, disable=["ner", "lemmatizer"])).examples
    assert used[0] == used[1] == fresh
