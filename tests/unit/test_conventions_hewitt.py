"""Hewitt & Manning (2019)'s punctuation in the structural probes (``probe_punctuation="hewitt2019"``):
the words left out are those whose PTB XPOS is in their reporter.py list, for UUAS and root accuracy
only. Pinned against their reporter's rule written out here (Kruskal over the non-punctuation words of
both the gold and the predicted distance matrix; the least deep non-punctuation word as the root)."""
from __future__ import annotations

import numpy as np
import pytest

from bertology.config import CompareConfig
from bertology.commands.selection import complete_config
from bertology.conventions import PRESETS, choose, resolve
from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError
from bertology.experiments.probe import ProbeSettings, settings_from, tree_set
from bertology.metrics.trees import score_depths, score_distances, tree_depths, tree_distances

THEIR_PUNCT = ["''", ",", ".", ":", "``", "-LRB-", "-RRB-"]  # read off structural-probes/reporter.py

# Punctuation words are leaves. HYPH/NFP words are UPOS PUNCT but not in their list; a ',' tagged SYM is theirs only.
FIXTURE = [
    Example("well - known ( old ) film !!", words=("well", "-", "known", "(", "old", ")", "film", "!!"),
            upos=("ADV", "PUNCT", "ADJ", "PUNCT", "ADJ", "PUNCT", "NOUN", "PUNCT"),
            xpos=("RB", "HYPH", "VBN", "-LRB-", "JJ", "-RRB-", "NN", "NFP"),
            heads=(3, 3, 7, 5, 7, 5, 0, 7), deprels=("advmod", "punct", "amod", "punct", "amod", "punct", "root", "punct")),
    Example("we saw , it ran : so .", words=("we", "saw", ",", "it", "ran", ":", "so", "."),
            upos=("PRON", "VERB", "SYM", "PRON", "VERB", "PUNCT", "ADV", "PUNCT"),
            xpos=("PRP", "VBD", ",", "PRP", "VBD", ":", "RB", "."),
            heads=(2, 0, 2, 5, 2, 5, 5, 2), deprels=("nsubj", "root", "dep", "nsubj", "ccomp", "punct", "advmod", "punct")),
    Example("`` go '' he said", words=("``", "go", "''", "he", "said"), upos=("PUNCT", "VERB", "PUNCT", "PRON", "VERB"),
            xpos=("``", "VB", "''", "PRP", "VBD"), heads=(2, 5, 2, 5, 0),
            deprels=("punct", "ccomp", "punct", "nsubj", "root")),
]
KEEP_UPOS = [[1, 0, 1, 0, 1, 0, 1, 0], [1, 1, 1, 1, 1, 0, 1, 0], [0, 1, 0, 1, 1]]
KEEP_HEWITT = [[1, 1, 1, 0, 1, 0, 1, 1], [1, 1, 0, 1, 1, 0, 1, 0], [0, 1, 0, 1, 1]]


def test_the_words_left_out_follow_their_xpos_list():
    corpus = Corpus(list(FIXTURE))
    for rule, expected in (("upos", KEEP_UPOS), ("hewitt2019", KEEP_HEWITT)):
        keep = tree_set(corpus, punctuation=rule).keep
        assert [k.astype(int).tolist() for k in keep] == expected, rule
    no_xpos = tree_set(Corpus([Example("a b", words=("a", "b"), heads=(0, 1))]), punctuation="hewitt2019")
    assert no_xpos.stats["n_without_xpos"] == 1 and no_xpos.keep[0].all()


def _their_mst(matrix, xpos):
    """Their prims_matrix_to_edges: Kruskal over the ordered pairs of non-punctuation words, by distance."""
    n = len(matrix)
    parent = list(range(n))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    pairs = [(matrix[i][j], i, j) for i in range(n) for j in range(n)
             if xpos[i] not in THEIR_PUNCT and xpos[j] not in THEIR_PUNCT]
    edges = []
    for _, i, j in sorted(pairs, key=lambda p: p[0]):
        if find(i) != find(j):
            parent[find(i)] = j
            edges.append((i, j))
    return {tuple(sorted(e)) for e in edges}


def _their_root(depths, xpos):
    """Their get_nopunct_argmin: the least deep word not tagged as punctuation."""
    order = np.argsort(depths, kind="stable")
    return next((int(i) for i in order if xpos[i] not in THEIR_PUNCT), int(order[0]))


def test_uuas_and_root_accuracy_equal_their_reporter_and_spearman_keeps_every_word():
    rng = np.random.default_rng(0)
    trees = tree_set(Corpus(list(FIXTURE)), punctuation="hewitt2019")
    for trial in range(5):
        dists, depths = [], []
        for ex in FIXTURE:
            x = rng.normal(size=(len(ex.words), 3))
            dists.append(((x[:, None] - x[None]) ** 2).sum(-1))
            depths.append(rng.normal(size=len(ex.words)) + np.asarray(tree_depths(ex.heads)) * trial / 2)
        found = total = right = 0
        for ex, d in zip(FIXTURE, dists):
            gold = _their_mst(tree_distances(ex.heads).tolist(), ex.xpos)
            found, total = found + len(gold & _their_mst(d.tolist(), ex.xpos)), total + len(gold)
        for ex, dep in zip(FIXTURE, depths):
            right += ex.heads.index(0) == _their_root(dep, ex.xpos)
        ours_d = score_distances(dists, trees.heads, trees.keep)
        ours_r = score_depths(depths, trees.heads, trees.keep)
        assert ours_d["uuas"] == pytest.approx(found / total, abs=1e-12)
        assert ours_r["root_acc"] == pytest.approx(right / len(FIXTURE), abs=1e-12)
        everyone = [np.ones(len(ex.words), dtype=bool) for ex in FIXTURE]  # DSpr and NSpr never read the keep masks
        assert ours_d["dspr"] == score_distances(dists, trees.heads, everyone)["dspr"]
        assert ours_r["nspr"] == score_depths(depths, trees.heads, everyone)["nspr"]


def test_the_hewitt2019_preset_reaches_the_probe_settings_and_an_explicit_choice_wins():
    assert PRESETS["hewitt2019"] == {"probe_punctuation": "hewitt2019"}
    assert resolve(CompareConfig(conventions="hewitt2019")).probe_punctuation == "hewitt2019"
    assert settings_from(complete_config(CompareConfig(conventions="hewitt2019"))).punctuation == "hewitt2019"
    assert settings_from(complete_config(CompareConfig())).punctuation == "upos"
    assert choose("hewitt2019", "probe_punctuation", "upos") == "upos"
    with pytest.raises(BertologyError, match="Unknown probe_punctuation 'ptb'; choose from: upos, hewitt2019"):
        choose("bertology", "probe_punctuation", "ptb")
    with pytest.raises(BertologyError, match=r"--probe-punctuation \(punctuation\) must be one of upos, hewitt2019, not 'ptb'"):
        ProbeSettings(punctuation="ptb")

