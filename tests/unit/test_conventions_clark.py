"""Clark et al. (2019)'s own conventions (issue 20), each pinned against a fixture computed by their rule.

- ``relation_word_attention="clark2019"``: their released code's word-level maps (float16 maps, a word's
  column the float16 sum of its pieces' columns, a word's row its first piece's row, self set to 0
  and kept as a candidate, ``np.argmax``'s first maximum);
- ``entropy_smoothing="clark2019"``: their notebook's entropy of ``0.9999 p + 0.0001 / n``, in nats;
- ``head_map_distance="clark2019"``: their JS divergence (nats) of maps smoothed by 0.001, summed over
  tokens, embedded by metric MDS from 5 random starts.

The references below follow the rules as written in their code, with explicit loops and NumPy's own
float16 arithmetic, and do not call the functions they check.
"""
from __future__ import annotations

import inspect
import math
import warnings

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist

from bertology.activations.batch import PairBatch
from bertology.activations.extract import collate, run_analyses
from bertology.analyses.attention_targets import AttentionTargets, TargetConventions
from bertology.analyses.head_map import HeadMap
from bertology.analyses.relation_heads import RelationHeads, WordPooling
from bertology.config import CompareConfig
from bertology.conventions import describe, resolve
from bertology.data.corpus import Corpus, Example
from bertology.data.encode import encode_corpus
from bertology.metrics.attention import smoothed_entropy_sums
from bertology.metrics.word_argmax import clark_float16_columns
from bertology.models.hooks import Captured
from bertology.models.pair import ModelPair
from bertology.testing import SENTENCES, tiny_tokenizer


# ----------------------------------------------------------------------------------------- presets
def test_the_clark_preset_sets_all_four_of_clarks_conventions_and_an_explicit_setting_wins():
    plain = resolve(CompareConfig())
    assert (plain.relation_word_attention, plain.entropy_smoothing, plain.head_map_distance) == ("mean", "none", "js_distance")
    clark = resolve(CompareConfig(conventions="clark2019"))
    assert (clark.punctuation, clark.relation_word_attention, clark.entropy_smoothing, clark.head_map_distance) == (
        "clark2019", "clark2019", "clark2019", "clark2019")
    mixed = resolve(CompareConfig(conventions="clark2019", entropy_smoothing="none", head_map_distance="js_divergence"))
    assert (mixed.relation_word_attention, mixed.entropy_smoothing, mixed.head_map_distance) == (
        "clark2019", "none", "js_divergence")
    record = describe(clark)
    for field in ("relation_word_attention", "entropy_smoothing", "head_map_distance"):
        assert record[field]["value"] == "clark2019" and "Clark et al. 2019" in record[field]["source"], field


# ------------------------------------------------------------------------------------ relation heads
# [CLS] the cat ##s sat read ##ing book ##s [SEP]: words 0..4, "cats", "reading" and "books" in two pieces.
WORDS = ("the", "cats", "sat", "reading", "books")
HEADS = (2, 3, 0, 3, 4)  # the -> cats, cats -> sat, reading -> sat, books -> reading
DEPRELS = ("det", "nsubj", "root", "xcomp", "obj")
CLS, THE, CAT, S1, SAT, READ, ING, BOOK, S2, SEP = range(10)
PIECES = [[CLS], [THE], [CAT, S1], [SAT], [READ, ING], [BOOK, S2], [SEP]]  # Clark's words: [CLS] + words + [SEP]


def _relation_corpus() -> Corpus:
    return Corpus([Example(" ".join(WORDS), words=WORDS, heads=HEADS, deprels=DEPRELS)], name="clark")


def _designed_maps(seed: int) -> np.ndarray:
    """``[4 heads, 10, 10]`` float32 maps: head 0 random; heads 1-3 each built so one rule decides.

    - head 1: "cat" attends to "sat" (0.6) and "##s" to "the" (0.9): the first piece's row points to
      the gold head of "cats" (sat), the mean of the two rows to "the";
    - head 2: "the" gives 0.15 + 0.15 to "cats" and 0.30004 to "sat". In float32 "sat" is larger; in
      float16 both are 0.300048828125 (0.15 rounds to 0.1500244140625; the sum of two such values and
      0.30004 round to the same float16), so np.argmax takes the first, "cats", the gold head;
    - head 3: "the" gives all but 1e-7 to [CLS] and 2e-8 or 1e-8 to every word piece. In float16 every
      one of those is 0 (below 2**-25), so the row is all zeros, its own entry (set to 0) included,
      and np.argmax takes word 0, "the" itself: a miss, where leaving self out finds "cats" (4e-8).
    Every other row is a random distribution.
    """
    rng = np.random.default_rng(seed)
    maps = rng.dirichlet(np.full(10, 0.5), size=(4, 10)).astype(np.float32)
    maps[1, CAT] = 0.4 / 9
    maps[1, CAT, SAT] = 0.6
    maps[1, S1] = 0.01
    maps[1, S1, THE] = 1.0 - 0.01 * 9
    maps[2, THE] = 0.0
    maps[2, THE, [CAT, S1]] = 0.15
    maps[2, THE, SAT] = 0.30004
    maps[2, THE, CLS] = 1.0 - 0.6 - 0.00004
    maps[3, THE] = 1e-8
    maps[3, THE, [CAT, S1]] = 2e-8
    maps[3, THE, CLS] = 1.0 - 1e-7
    return maps


def _clark_predictions(head_map: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Their rule on one ``[T, T]`` map: predicted head word of each word, for the row and the transposed map."""
    a = head_map.astype(np.float16)  # their extraction stores float16
    W = len(PIECES)
    cols = np.stack([a[:, p].sum(axis=-1) for p in PIECES], axis=-1)  # to a word: its pieces' columns, in float16
    words = np.stack([cols[p[0]] for p in PIECES])  # from a word: its first piece's row
    out = []
    for m in (words, words.T.copy()):
        m[range(W), range(W)] = 0  # attention to self set to 0, still a candidate
        out.append(np.argmax(m[1:-1, 1:-1], axis=-1))  # [CLS]/[SEP] left out; the first maximum wins
    return out[0], out[1]


def _relation_batch(maps_base: np.ndarray, maps_tuned: np.ndarray) -> PairBatch:
    tok = tiny_tokenizer()
    enc = encode_corpus(_relation_corpus(), tok)
    assert tok.convert_ids_to_tokens(enc.items[0].input_ids.tolist())[CAT:SEP + 1] == [
        "cat", "##s", "sat", "read", "##ing", "book", "##s", "[SEP]"]
    t = collate(enc.items, tok.pad_token_id)
    caps = [Captured([], [None, torch.from_numpy(m[None])]) for m in (maps_base, maps_tuned)]
    return PairBatch(enc.items, t["input_ids"], t["mask"], t["content"], t["lengths"], *caps)


def _hits(analysis: RelationHeads, relation: str) -> np.ndarray:
    """Correct counts ``[model, direction, head]`` of one relation (one layer)."""
    return analysis.correct[analysis.relations.index(relation), :, :, 0]


def test_clark_relation_heads_reproduce_their_code_on_a_hand_built_example():
    maps = [_designed_maps(0), _designed_maps(1)]
    clark = RelationHeads(_relation_corpus(), 1, 4, min_count=1, word_attention="clark2019")
    paper = RelationHeads(_relation_corpus(), 1, 4, min_count=1)
    batch = _relation_batch(*maps)
    clark.update(batch)
    paper.update(batch)
    # Every pair, head, direction and model against their rule
    pairs = [(d, g - 1, r) for d, (g, r) in enumerate(zip(HEADS, DEPRELS)) if g > 0]
    for m, head_maps in enumerate(maps):
        for h in range(4):
            rows, cols = _clark_predictions(head_maps[h])
            for d, g, rel in pairs:
                for direction, pred in enumerate((rows, cols)):
                    assert _hits(clark, rel)[m, direction, h] == int(pred[d] == g), (m, h, rel, direction)
    # The three designed heads (base model, dep->head): their code and the paper's mean disagree
    assert _hits(clark, "nsubj")[0, 0, 1] == 1 and _hits(paper, "nsubj")[0, 0, 1] == 0  # first piece vs mean
    assert _hits(clark, "det")[0, 0, 2] == 1 and _hits(paper, "det")[0, 0, 2] == 0  # float16 tie -> first word
    assert _hits(clark, "det")[0, 0, 3] == 0 and _hits(paper, "det")[0, 0, 3] == 1  # float16 zeros -> self
    assert clark.params()["from_method"] == "first" and clark.params()["word_attention"] == "clark2019"
    with pytest.raises(ValueError, match="clark2019"):
        RelationHeads(_relation_corpus(), 1, 4, pooling=WordPooling(from_method="max"), word_attention="clark2019")


def test_float16_word_columns_add_the_pieces_as_numpy_does_for_their_float16_maps():
    """Words of 1 to 5 pieces: each first piece's column is NumPy's float16 ``sum`` of the pieces' columns.

    NumPy rounds every partial sum of such a slice to float16, which differs from rounding the exact
    sum once for words of three or more pieces (asserted, so the fixture tells the two apart).
    """
    rng = np.random.default_rng(7)
    sizes = [1, 3, 2, 5, 1, 4]  # pieces per word, after a [CLS] at 0; then [SEP] and two padding tokens
    T = 1 + sum(sizes) + 3
    word_ids = np.full((2, T), -1)
    word_ids[:, 1 : 1 + sum(sizes)] = np.repeat(np.arange(len(sizes)), sizes)
    word_ids[1, 1 + sum(sizes) - 4 :] = -1  # the second example ends earlier (its last word is cut off)
    att = rng.dirichlet(np.full(T, 0.3), size=(2, 3, T)).astype(np.float32)
    got = clark_float16_columns(att, word_ids)
    half = att.astype(np.float16)
    once_differs = False
    for b in range(2):
        for w in range(len(sizes)):
            pieces = np.flatnonzero(word_ids[b] == w)
            if not len(pieces):
                continue
            theirs = half[b][..., pieces].sum(axis=-1)  # [H, T]
            np.testing.assert_array_equal(got[b, :, :, pieces[0]], theirs.astype(np.float32))
            once = half[b][..., pieces].astype(np.float64).sum(-1).astype(np.float16)
            once_differs |= bool((once != theirs).any())
    assert once_differs
    np.testing.assert_array_equal(got[:, :, :, 0], half[:, :, :, 0])  # tokens without a word: only rounded


def test_clark_relation_heads_on_a_model_agree_with_their_rule_and_merge(planted_pair):
    """Through the real extraction: every count equals their rule, sentence by sentence.

    One example a batch, so the maps are bit for bit those of the reference's own forward pass (a
    float32 difference from padding could move a value across a float16 rounding boundary).
    """
    pair = ModelPair.load(*map(str, planted_pair))
    words_list = [("the", "cats", "sat", "reading", "books"), ("she", "liked", "the", "movies"),
                  ("the", "old", "dogs", "ran", "to", "the", "big", "houses")]
    heads_list = [HEADS, (2, 0, 4, 2), (3, 3, 4, 0, 8, 8, 8, 4)]
    corpus = Corpus([Example(" ".join(w), words=w, heads=h, deprels=("dep",) * len(w))
                     for w, h in zip(words_list, heads_list)], name="clark")
    enc = encode_corpus(corpus, pair.tokenizer)
    whole = RelationHeads(corpus, pair.num_layers, pair.num_heads, min_count=1, word_attention="clark2019")
    run_analyses(pair, enc, [whole], batch_size=1)
    expected = np.zeros((2, 2, pair.num_layers, pair.num_heads), dtype=np.int64)
    for it, ex in zip(enc.items, corpus):
        wid = np.asarray(it.word_ids)
        pieces = [[0]] + [list(np.flatnonzero(wid == w)) for w in range(len(ex.words))] + [[len(wid) - 1]]
        with torch.inference_mode():
            for m, model in enumerate((pair.base.model, pair.tuned.model)):
                out = model(input_ids=torch.from_numpy(it.input_ids[None]), output_attentions=True)
                for layer in range(pair.num_layers):
                    for h in range(pair.num_heads):
                        a = out.attentions[layer][0, h].numpy().astype(np.float16)
                        cols = np.stack([a[:, p].sum(axis=-1) for p in pieces], axis=-1)
                        words = np.stack([cols[p[0]] for p in pieces])
                        for direction, mat in enumerate((words, words.T.copy())):
                            mat[range(len(pieces)), range(len(pieces))] = 0
                            pred = np.argmax(mat[1:-1, 1:-1], axis=-1)
                            expected[m, direction, layer, h] += sum(
                                int(pred[d] == g - 1) for d, g in enumerate(ex.heads) if g > 0)
    np.testing.assert_array_equal(whole.correct[whole.relations.index("all")], expected)
    # shards merge to the whole, as for the default rule
    shards = []
    for part in (corpus.subset([0]), corpus.subset([1, 2])):
        shards.append(RelationHeads(part, pair.num_layers, pair.num_heads, min_count=1, word_attention="clark2019"))
        run_analyses(pair, encode_corpus(part, pair.tokenizer), [shards[-1]], batch_size=1)
    merged = shards[0].merge(shards[1])
    np.testing.assert_array_equal(merged.correct[merged.relations.index("all")], expected)
    with pytest.raises(ValueError):
        whole.merge(RelationHeads(corpus, pair.num_layers, pair.num_heads, min_count=1))


# ------------------------------------------------------------------------------------------- entropy
def _clark_entropy(rows: list[list[float]]) -> float:
    """Their notebook's entropy of one example's map: rows smoothed to 0.9999 p + 0.0001 / n, nats, mean over rows."""
    n = len(rows)
    total = 0.0
    for row in rows:
        for p in row:
            q = 0.9999 * p + 0.0001 / n
            total -= q * math.log(q)
    return total / n


# Two examples (3 and 2 real tokens) of one head, with exact zeros, as a padded batch of width 3.
EXAMPLE_ROWS = [
    [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]],
    [[0.0, 1.0], [0.25, 0.75]],
]


def _padded(rows_list: list[list[list[float]]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    att = torch.zeros(len(rows_list), 1, width, width, dtype=torch.float64)
    mask = torch.zeros(len(rows_list), width, dtype=torch.bool)
    for b, rows in enumerate(rows_list):
        n = len(rows)
        att[b, 0, :n, :n] = torch.tensor(rows, dtype=torch.float64)
        mask[b, :n] = True
    return att, mask


def test_smoothed_entropy_is_clarks_formula_over_the_real_tokens_only():
    att, mask = _padded(EXAMPLE_ROWS, 3)
    att[1, 0, 2, :] = 0.3  # garbage in the padding row: must not count
    sums = smoothed_entropy_sums(att, mask)
    for b, rows in enumerate(EXAMPLE_ROWS):
        assert sums[b, 0].item() / len(rows) == pytest.approx(_clark_entropy(rows), rel=1e-13, abs=0.0)
    # Without smoothing the same rows have entropies 0, ln 2, ... : the smoothing adds a measurable amount
    plain = -sum(p * math.log(p) for p in (0.2, 0.3, 0.5)) / 3 + math.log(2) / 3
    assert sums[0, 0].item() / 3 - plain > 1e-4


def test_attention_targets_report_clarks_smoothed_entropy():
    tok = tiny_tokenizer()
    corpus = Corpus.from_list(["a dull film", "we"])  # [CLS] a dull film [SEP] (5 tokens), [CLS] we [SEP] (3)
    enc = encode_corpus(corpus, tok)
    t = collate(enc.items, tok.pad_token_id)
    rng = np.random.default_rng(0)
    rows_list = []
    for it in enc.items:
        n = len(it)
        rows = rng.dirichlet(np.full(n, 0.3), size=n)
        rows[rows < 0.05] = 0.0  # exact zeros, where smoothing matters most
        rows_list.append((rows / rows.sum(-1, keepdims=True)).tolist())
    att, _ = _padded(rows_list, t["mask"].shape[1])
    batch = PairBatch(enc.items, t["input_ids"], t["mask"], t["content"], t["lengths"],
                      Captured([], [None, att.float()]), Captured([], [None, att.float()]))
    values = {}
    for smoothing in ("none", "clark2019"):
        a = AttentionTargets(corpus, tok, 1, 1, word_level=False,
                             conventions=TargetConventions(entropy_smoothing=smoothing))
        a.update(batch)
        table = a.compute().table
        values[smoothing] = table[(table.target == "entropy") & (table.model == "base")]["value"].item()
    rows32 = [np.asarray(r, dtype=np.float32).astype(np.float64).tolist() for r in rows_list]  # the batch is float32
    expected = np.mean([_clark_entropy(r) for r in rows32])
    assert values["clark2019"] == pytest.approx(expected, rel=1e-12)
    plain = np.mean([np.mean([-sum(p * math.log(p) for p in row if p > 0) for row in r]) for r in rows32])
    assert values["none"] == pytest.approx(plain, rel=1e-6)  # the default is unchanged (float32 row sums)
    assert values["clark2019"] - values["none"] > 1e-4
    with pytest.raises(ValueError, match="entropy_smoothing"):
        AttentionTargets(corpus, tok, 1, 1, conventions=TargetConventions(entropy_smoothing="clark"))


# ------------------------------------------------------------------------------------------ head map
def _clark_head_distances(pair: ModelPair, corpus: Corpus, indices) -> tuple[np.ndarray, int]:
    """Their matrix for the sampled examples: JS (nats) of 0.001-smoothed maps, summed over every token."""
    K = 2 * pair.num_layers * pair.num_heads
    total = np.zeros((K, K))
    n_tokens = 0
    enc = encode_corpus(corpus, pair.tokenizer)
    for it in enc.items:
        if it.index not in indices:
            continue
        with torch.inference_mode():
            maps = [model(input_ids=torch.from_numpy(it.input_ids[None]), output_attentions=True).attentions
                    for model in (pair.base.model, pair.tuned.model)]
        heads = np.concatenate([np.asarray(layer[0], dtype=np.float64) for m in maps for layer in m])  # [K, T, T]
        n = heads.shape[-1]
        n_tokens += n
        p = 0.999 * heads + 0.001 / n
        for i in range(K):
            for j in range(K):
                mix = (p[i] + p[j]) / 2
                total[i, j] += 0.5 * (p[i] * np.log(p[i] / mix) + p[j] * np.log(p[j] / mix)).sum()
    return total, n_tokens


def _sklearn_mds_as_clark(d: np.ndarray, seed: int) -> np.ndarray:
    """Their notebook's ``MDS(metric=True, n_init=5, eps=1e-10, max_iter=1000)`` on a precomputed matrix, seeded."""
    from sklearn.manifold import MDS

    kw = dict(n_components=2, n_init=5, eps=1e-10, max_iter=1000, random_state=seed)
    if "metric_mds" in inspect.signature(MDS).parameters:
        kw.update(metric_mds=True, metric="precomputed", init="random")
    else:
        kw.update(metric=True, dissimilarity="precomputed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return MDS(**kw).fit_transform(d)


def test_clark_head_map_is_their_summed_smoothed_divergence_and_their_mds(planted_pair):
    pair = ModelPair.load(*map(str, planted_pair))
    corpus = Corpus.from_list(SENTENCES[:6])
    enc = encode_corpus(corpus, pair.tokenizer)
    a = HeadMap(pair.num_layers, pair.num_heads, max_examples=4, seed=3, distance="clark2019",
                example_indices=[it.index for it in enc.items])
    run_analyses(pair, enc, [a], batch_size=4)
    expected, n_tokens = _clark_head_distances(pair, corpus, set(a.sample.tolist()))
    assert n_tokens == int(a.rows.sum()) and len(a.sample) == 4
    got = a.distance_matrix()
    # Per token the code takes JS as H(m) - (H(p) + H(q)) / 2 from float32 entropies of n <= 16 keys,
    # each summed with an error of at most ~n eps32 (1 / e per term): 16 * 6e-8 * 0.4 * 2 ~ 1e-6 nats
    # per token, plus float32 map differences of the padded batch; 4e-6 nats per token bounds both.
    np.testing.assert_allclose(got, expected, rtol=0, atol=4e-6 * n_tokens)
    assert expected.max() > 1000 * 4e-6 * n_tokens  # the planted head makes the matrix far from 0
    table = a.compute().table
    assert (table.distance == "clark2019").all()
    # The map is sklearn's metric MDS with their settings (seeded): same configuration up to rotation
    theirs = _sklearn_mds_as_clark(got, seed=3)
    np.testing.assert_allclose(pdist(table[["x", "y"]].to_numpy()), pdist(theirs), rtol=0, atol=1e-9 * pdist(theirs).max())
    np.testing.assert_array_equal(a.compute().table[["x", "y"]], table[["x", "y"]])  # seeded: the same map again
    p = a.params()
    assert p["mds"] == {"metric": True, "init": "random", "n_init": 5, "max_iter": 1000, "eps": 1e-10, "random_state": 3}
    assert "nats" in p["divergence"] and "0.001" in p["divergence"]
    with pytest.raises(ValueError, match="smoothed"):
        HeadMap(2, 4).distance_matrix("clark2019")
