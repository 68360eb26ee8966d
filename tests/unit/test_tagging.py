"""Token classification as a task (issue 15, item 2): metrics against sklearn / seqeval, labels on first word
pieces (WordPiece and byte-level BPE), the model's task from its head, and every scoring experiment on a
tagger — cached == naive sweep, the intact row against a direct forward, head importance, degeneracy."""
import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from seqeval.metrics import f1_score, precision_score, recall_score
from sklearn.metrics import accuracy_score

from bertology.data.corpus import Corpus, Example
from bertology.data.encode import encode_corpus
from bertology.errors import BertologyError
from bertology.experiments.ablation import HeadScoring, SweepPlan, run_ablation, summary
from bertology.experiments.head_importance import PruningPlan, run_head_importance
from bertology.models.loading import load_model
from bertology.tasks.bio_tagging import entity_counts
from bertology.tasks.catalog import get_task, task_of_model
from bertology.tasks.tagging import IGNORE, first_pieces, is_bio
from bertology.testing import SENTENCES, save_tiny_bert, save_tiny_tagger
from bertology.testing.tokenizers import tiny_tokenizer

UPOS = ["DET", "NOUN", "VERB", "ADJ", "PUNCT", "X"]
BIO = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
_RULE = {"the": "DET", "a": "DET", "this": "DET", ".": "PUNCT", ",": "PUNCT", "!": "PUNCT", "was": "VERB",
         "saw": "VERB", "sat": "VERB", "ran": "VERB", "good": "ADJ", "old": "ADJ", "big": "ADJ", "red": "ADJ"}


def _upos_corpus() -> Corpus:
    """The tiny sentences with a rule's UPOS tags (and BIO tags: john/mary are people, house a place)."""
    exs = []
    for s in SENTENCES + [" ".join(reversed(s.split())) for s in SENTENCES]:
        words = tuple(s.split())
        upos = tuple(_RULE.get(w, "NOUN") for w in words)
        bio = tuple("B-PER" if w in ("john", "mary") else "B-LOC" if w == "house" else
                    "I-LOC" if w == "night" else "O" for w in words)
        exs.append(Example(text=s, words=words, upos=upos, tags=bio))
    return Corpus(exs, name="tiny-tags")


@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
    return load_model(save_tiny_tagger(tmp_path_factory.mktemp("tagger"), UPOS, tag_field="upos", initializer_range=0.3))


@pytest.fixture(scope="module")
def bio_tagger(tmp_path_factory):
    return load_model(save_tiny_tagger(tmp_path_factory.mktemp("bio"), BIO, tag_field="tags", initializer_range=0.3))


# ------------------------------------------------------------------ metrics by hand


def _random_bio(rng, n_sent: int) -> tuple[list[list[str]], list[list[str]]]:
    gold, pred = [], []
    for _ in range(n_sent):
        n = int(rng.integers(1, 9))
        g = list(rng.choice(BIO, size=n, p=[0.5, 0.15, 0.1, 0.15, 0.1]))
        p = [t if rng.random() < 0.7 else str(rng.choice(BIO)) for t in g]
        gold.append(g)
        pred.append(p)
    return gold, pred


def _records(gold, pred) -> dict[str, np.ndarray]:
    counts = np.array([entity_counts(g, p) for g, p in zip(gold, pred)])
    return {
        "correct": np.array([[sum(a == b for a, b in zip(g, p)) for g, p in zip(gold, pred)]]),
        "n_words": np.array([[len(g) for g in gold]]),
        "loss": np.zeros((1, len(gold))),
        "tp": counts[None, :, 0], "n_pred": counts[None, :, 1], "n_gold": counts[None, :, 2],
    }


def test_entity_scores_equal_seqeval_on_the_data_and_on_a_repeated_sample():
    rng = np.random.default_rng(0)
    gold, pred = _random_bio(rng, 40)
    task = get_task("bio_tagging")
    rec = _records(gold, pred)
    y = np.empty(len(gold), dtype=object)
    ones = task.scores(np.ones((1, len(gold))), rec, y)
    assert ones["entity_f1"][0, 0] == pytest.approx(f1_score(gold, pred), abs=1e-12)
    assert ones["entity_precision"][0, 0] == pytest.approx(precision_score(gold, pred), abs=1e-12)
    assert ones["entity_recall"][0, 0] == pytest.approx(recall_score(gold, pred), abs=1e-12)
    flat_g, flat_p = sum(gold, []), sum(pred, [])
    assert ones["accuracy"][0, 0] == pytest.approx(accuracy_score(flat_g, flat_p), abs=1e-12)
    # a bootstrap row of multinomial counts = seqeval on the sample with each sentence repeated that often
    counts = rng.multinomial(len(gold), np.full(len(gold), 1 / len(gold)), size=3).astype(np.float32)
    boot = task.scores(counts, rec, y)
    for r, c in enumerate(counts):
        g = [s for s, k in zip(gold, c) for _ in range(int(k))]
        p = [s for s, k in zip(pred, c) for _ in range(int(k))]
        assert boot["entity_f1"][r, 0] == pytest.approx(f1_score(g, p), abs=1e-12)
        assert boot["entity_recall"][r, 0] == pytest.approx(recall_score(g, p), abs=1e-12)
        assert boot["accuracy"][r, 0] == pytest.approx(accuracy_score(sum(g, []), sum(p, [])), abs=1e-12)


def test_records_count_words_tags_and_cross_entropy_like_a_slow_loop():
    rng = np.random.default_rng(1)
    logits = torch.from_numpy(rng.normal(size=(3, 7, 5)))
    targets = torch.from_numpy(rng.integers(0, 5, size=(3, 7)))
    targets[:, 0] = IGNORE
    targets[1, 4:] = IGNORE
    targets[2, 2] = IGNORE
    task = get_task("bio_tagging").with_labels(BIO)
    rec = task.record(logits, targets)
    lg, tg = logits.numpy(), targets.numpy()
    for i in range(3):
        keep = tg[i] != IGNORE
        pred = lg[i].argmax(-1)[keep]
        ce = logsumexp(lg[i][keep], axis=-1) - lg[i][keep, tg[i][keep]]
        assert rec["n_words"][i] == keep.sum() and rec["correct"][i] == (pred == tg[i][keep]).sum()
        assert rec["loss"][i] == pytest.approx(ce.sum(), rel=1e-12)
        assert list(rec["pred"][i]) == list(np.bincount(pred, minlength=5))
        g, p = [BIO[t] for t in tg[i][keep]], [BIO[t] for t in pred]
        assert (rec["tp"][i], rec["n_pred"][i], rec["n_gold"][i]) == entity_counts(g, p)
    # the training loss is the mean over every scored word of the batch
    mean = task.loss(logits.float(), targets)
    assert float(mean) == pytest.approx(rec["loss"].sum() / rec["n_words"].sum(), rel=1e-5)


def test_bio_tag_sets_are_recognised():
    assert is_bio(["O", "B-PER", "I-PER"]) and is_bio(["B-NP", "I-NP", "O"])
    assert not is_bio(["NOUN", "VERB"]) and not is_bio(["O"]) and not is_bio(["O", "B-PER", "NOUN"])


# ------------------------------------------------------------------ labels on first pieces


def _first_pieces_by_offsets(tok, words: list[str]) -> list[int]:
    """Each word's first token by Hugging Face's own ``word_ids()`` of the space-joined text (the usual
    token-classification recipe; a byte-level BPE's lone "Ġ" before a word belongs to that word)."""
    word_ids = tok(" ".join(words)).word_ids()
    assert max(w for w in word_ids if w is not None) == len(words) - 1  # the words are the pre-tokenizer's words
    return [word_ids.index(i) for i in range(len(words))]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_labels_sit_on_each_words_first_piece(kind, tmp_path):
    tok = tiny_tokenizer(kind, tmp_path / kind)
    words = ["The", "children", "played", "happily", "in", "Zürich", "!"]
    corpus = Corpus([Example(text=" ".join(words), words=tuple(words), upos=tuple("X" * len(words)))])
    item = encode_corpus(corpus, tok).items[0]
    expected = _first_pieces_by_offsets(tok, words)
    assert len(item) > len(words) + 2  # some words split into several pieces: the placement matters
    assert list(first_pieces(item, len(words))) == expected
    y = np.arange(len(words), dtype=np.int64) + 10
    t = get_task("tagging").collate_targets([item], [y])[0].numpy()
    assert list(t[expected]) == list(y)
    assert (np.delete(t, expected) == IGNORE).all()  # other pieces, specials and nothing else


# ------------------------------------------------------------------ the model's task


def test_task_of_a_token_classifier(tagger, bio_tagger, tmp_path):
    assert task_of_model(tagger.model).name == "tagging"
    bio = task_of_model(bio_tagger.model)
    assert bio.name == "bio_tagging" and bio.id2label == tuple(BIO)
    with pytest.raises(BertologyError, match="no token-classification head"):
        get_task("tagging").check_model(load_model(save_tiny_bert(tmp_path, classifier=True)).model)


def test_targets_name_unknown_tags_and_missing_tags(tagger):
    corpus = _upos_corpus()
    task = task_of_model(tagger.model)
    y = task.targets(corpus, tagger.model)
    assert [UPOS[i] for i in y[0]] == list(corpus[0].upos)
    bad = Corpus([Example(text="the cat", words=("the", "cat"), upos=("DET", "PROPN"))], source="bad.conllu")
    with pytest.raises(BertologyError, match=r"upos tag\(s\) 'PROPN' that the model does not know"):
        task.targets(bad, tagger.model)
    with pytest.raises(BertologyError, match=r"no upos tags for example 1"):
        task.targets(Corpus.from_list(["the cat"]), tagger.model)


# ------------------------------------------------------------------ scoring experiments on a tagger


def _direct_word_predictions(model, tok, corpus) -> tuple[list[list[int]], list[float]]:
    """Each word's predicted tag (from its first piece by character offsets) and its cross-entropy,
    one sentence at a time with no bertology code in between."""
    preds, ces = [], []
    with torch.inference_mode():
        for ex in corpus:
            enc = tok(ex.text, return_tensors="pt")
            lg = model(**enc).logits[0].double().numpy()
            first = _first_pieces_by_offsets(tok, list(ex.words))
            preds.append([int(lg[t].argmax()) for t in first])
            ces.append([float(logsumexp(lg[t]) - lg[t, UPOS.index(g)]) for t, g in zip(first, ex.upos)])
    return preds, ces


def test_ablation_of_a_tagger_scores_words_like_a_direct_forward(tagger):
    corpus = _upos_corpus()
    enc = encode_corpus(corpus, tagger.tokenizer)
    task = task_of_model(tagger.model)
    y = task.targets(corpus, tagger.model)
    res = run_ablation(tagger.model, enc, y, HeadScoring.for_tokenizer(tagger.tokenizer, batch_size=5), n_bootstrap=100)
    t = res.table
    assert set(t["metric"]) == {"accuracy", "loss"} and set(t["task"]) == {"tagging"}
    intact = t[t["target"] == "intact"].set_index("metric")["value"]
    preds, ces = _direct_word_predictions(tagger.model, tagger.tokenizer, corpus)
    gold = [UPOS.index(g) for ex in corpus for g in ex.upos]
    # float32 forwards, padded in batches vs one at a time: argmaxes agree, losses to ~1e-6
    assert intact["accuracy"] == pytest.approx(accuracy_score(gold, sum(preds, [])), abs=1e-12)
    assert intact["loss"] == pytest.approx(np.mean(sum(ces, [])), rel=1e-5)
    heads = t[(t["target"] == "head") & (t["metric"] == "accuracy")]
    assert len(heads) == 8 and heads["ci_low"].le(heads["delta"] + 1e-12).all()
    assert res.params["task"] == "tagging" and "predicted_tags" in res.params["degenerate"]
    assert "intact: accuracy " in summary({"ablation": t})


@pytest.mark.parametrize("mode", ["uniform", "zero", "mean"])
def test_cached_and_naive_sweeps_of_a_tagger_agree(tagger, mode):
    corpus = _upos_corpus()
    enc = encode_corpus(corpus, tagger.tokenizer)
    y = task_of_model(tagger.model).targets(corpus, tagger.model)
    scoring = HeadScoring.for_tokenizer(tagger.tokenizer, mode=mode, batch_size=4)
    a = run_ablation(tagger.model, enc, y, scoring, n_bootstrap=0, sweep=SweepPlan(method="cached"))
    b = run_ablation(tagger.model, enc, y, scoring, n_bootstrap=0, sweep=SweepPlan(method="naive"))
    assert a.params["method"] == "cached"
    # the cached sweep replays the same float32 operations on cached inputs: agreement to float rounding
    assert np.allclose(a.table["value"], b.table["value"], rtol=1e-5, atol=1e-6)
    for key in a.per_example:
        assert (a.per_example[key]["pred"] == b.per_example[key]["pred"]).all()


def test_bio_tagger_ablation_has_entity_scores_equal_to_seqeval(bio_tagger):
    corpus = _upos_corpus()
    enc = encode_corpus(corpus, bio_tagger.tokenizer)
    task = task_of_model(bio_tagger.model)
    y = task.targets(corpus, bio_tagger.model)
    res = run_ablation(bio_tagger.model, enc, y, HeadScoring(batch_size=6), n_bootstrap=50,
                       sweep=SweepPlan(layers=[2]))
    intact = res.table[res.table["target"] == "intact"].set_index("metric")["value"]
    with torch.inference_mode():
        pred = []
        for ex in corpus:
            lg = bio_tagger.model(**bio_tagger.tokenizer(ex.text, return_tensors="pt")).logits[0]
            first = _first_pieces_by_offsets(bio_tagger.tokenizer, list(ex.words))
            pred.append([BIO[int(lg[t].argmax())] for t in first])
    gold = [list(ex.tags) for ex in corpus]
    assert intact["entity_f1"] == pytest.approx(f1_score(gold, pred), abs=1e-12)
    assert intact["entity_precision"] == pytest.approx(precision_score(gold, pred), abs=1e-12)
    assert set(res.table["metric"]) == {"accuracy", "entity_f1", "entity_precision", "entity_recall", "loss"}


def test_head_importance_of_a_tagger_uses_the_word_cross_entropy(tagger, tmp_path):
    corpus = _upos_corpus()
    enc = encode_corpus(corpus, tagger.tokenizer)
    y = task_of_model(tagger.model).targets(corpus, tagger.model)
    imp = run_head_importance(tagger.model, enc, y, HeadScoring(batch_size=6), pruning=PruningPlan(0.5), progress_dir=tmp_path)
    assert (imp.importance["importance_raw"] > 0).all()
    _, ces = _direct_word_predictions(tagger.model, tagger.tokenizer, corpus)
    first = imp.curve[(imp.curve["n_removed"] == 0) & (imp.curve["metric"] == "loss")]["value"].iloc[0]
    assert first == pytest.approx(np.mean(sum(ces, [])), rel=1e-5)
    # resumed from the saved passes: the tag-count records come back, the curve is the same
    again = run_head_importance(tagger.model, enc, y, HeadScoring(batch_size=6), pruning=PruningPlan(0.5), progress_dir=tmp_path)
    assert np.allclose(again.curve["value"], imp.curve["value"])


def test_a_tagger_predicting_one_tag_is_degenerate():
    task = get_task("tagging")
    const = task.degeneracy(0.6, 50, 1, 0.6)
    assert const.flagged and const.constant_predictions and "one tag" in const.note
    weak = task.degeneracy(0.62, 50, 4, 0.6)  # Wilson over 50 sentences reaches below the majority rate
    assert weak.flagged and not weak.constant_predictions
    assert not task.degeneracy(0.95, 200, 12, 0.3).flagged
    y = np.empty(2, dtype=object)
    y[:] = [np.array([0, 0, 1]), np.array([0, 2])]
    assert task.chance(y) == pytest.approx(3 / 5)
