"""The cached revert and transplant sweeps (units below the first changed layer run once) against full forwards.

The cached path hands block ``l`` the hidden states a full forward gives it and keeps every matrix product's
shape, so per-example predictions and losses are compared with no tolerance, for every unit. A family whose blocks
cannot be bypassed (DeBERTa-v2) runs full forwards and says so.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from bertology.data.corpus import Corpus, Example
from bertology.data.encode import encode_corpus
from bertology.experiments.layer_cache import first_layer
from bertology.experiments.intervention_sweep import sweep_units, variants
from bertology.experiments.interventions import Revert
from bertology.experiments.revert_sweep import plan_revert_units
from bertology.experiments.scoring import HeadScoring, ProgressStore, classifier_batches
from bertology.experiments.transplant_score import HEAD_ALONE_KEY, TUNED_KEY
from bertology.experiments.transplant_sweep import plan_transplant, starts, sweep_runs, transplant_variants
from bertology.models import sites
from bertology.models.loading import load_model
from bertology.models.transplant import Part
from bertology.testing import SENTENCES, move_every_weight, save_tiny_family, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def _setup(tmp_path, model_type: str):
    """(base, tuned classifier with every weight moved, batches of 20 sentences in 3 length buckets)."""
    folder = save_tiny_family(tmp_path / model_type, model_type)
    base = load_model(folder).model
    torch.manual_seed(1)
    tuned = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2, attn_implementation="eager").eval()
    move_every_weight(tuned.parameters(), 0.3)
    tok = tiny_tokenizer()
    texts = SENTENCES * 2
    labels = [i % 2 for i in range(len(texts))]
    corpus = Corpus([Example(t, label=str(y)) for t, y in zip(texts, labels)], source="test")
    scoring = HeadScoring.for_tokenizer(tok, batch_size=8)
    return base, tuned, classifier_batches(tuned, encode_corpus(corpus, tok, 64), np.array(labels), scoring)


def _attention_calls(model) -> list[int]:
    """A counter of block 1's attention computations (bypassed blocks do not compute it)."""
    calls = [0]
    sites.attention(model, 1).register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _both(sweep, model, keys) -> tuple[ProgressStore, ProgressStore, dict]:
    """Run ``sweep(store, method)`` cached and naive; the two stores and, per method, what ran and block-1 calls."""
    calls = _attention_calls(model)
    ran = {}
    stores = []
    for method in ("cached", "naive"):
        store = ProgressStore(None, "x")
        before = calls[0]
        ran[method] = (sweep(store, method), calls[0] - before)
        stores.append(store)
        assert set(store.memory) == set(keys)
    return stores[0], stores[1], ran


def _assert_same(cached: ProgressStore, naive: ProgressStore) -> None:
    for key, ref in naive.memory.items():
        for rec in ("pred", "loss"):
            np.testing.assert_array_equal(cached.get(key)[rec], ref[rec], err_msg=f"{key} {rec}")


def test_cached_revert_equals_full_forwards_for_every_unit(tmp_path):
    base, tuned, batches = _setup(tmp_path, "bert")
    units, _ = plan_revert_units(tuned)
    before = {k: v.clone() for k, v in tuned.state_dict().items()}
    cached, naive, ran = _both(lambda s, m: sweep_units(tuned, Revert(base), batches, s, units, method=m), tuned,
                               [u.key for u in units])
    _assert_same(cached, naive)
    assert ran["cached"][0] == "cached" and ran["naive"][0] == "naive"
    assert ran["cached"][1] < ran["naive"][1]  # block 1 ran for the layer-1 units, the embeddings and the cache only
    assert all(torch.equal(before[k], v) for k, v in tuned.state_dict().items())
    starts_by_key = {v.key: v.start for v in variants(tuned, Revert(base), units)}
    n = sites.num_layers(tuned)
    assert starts_by_key["intact"] == n + 1 and starts_by_key["layer-embeddings-L0"] == 0
    assert starts_by_key["head-L2-H1"] == starts_by_key["layer-ffn-L2"] == 2
    # the units differ from the tuned model (else equal records would prove nothing)
    assert not np.array_equal(naive.get("layer-layer-L2")["loss"], naive.get("intact")["loss"])


def test_cached_transplant_equals_full_forwards_for_every_set(tmp_path):
    base, tuned, batches = _setup(tmp_path, "bert")
    rows, _ = plan_transplant(tuned, heads=True)
    runs = {TUNED_KEY: frozenset(), HEAD_ALONE_KEY: frozenset()} | {r.key: r.parts for r in rows}
    cached, naive, ran = _both(lambda s, m: sweep_runs(tuned, base, batches, s, runs, method=m), tuned, runs)
    _assert_same(cached, naive)
    assert ran["cached"][0] == "cached" and ran["cached"][1] < ran["naive"][1]
    refs = {v.key: (v.reference, v.start) for v in transplant_variants(tuned, base, runs)}
    n = sites.num_layers(tuned)
    assert refs["transplant-L2"] == (HEAD_ALONE_KEY, 2)  # the top-1 curve point too (layer L = 2)
    assert refs["transplant-emb+L1"] == (TUNED_KEY, 2)  # bottom 1: the tuned model's embeddings and layer 1
    assert refs[HEAD_ALONE_KEY] == (HEAD_ALONE_KEY, n + 1) and refs[TUNED_KEY] == (TUNED_KEY, n + 1)
    assert not np.array_equal(naive.get(HEAD_ALONE_KEY)["loss"], naive.get(TUNED_KEY)["loss"])


def test_starts_count_only_what_differs_from_each_reference():
    assert starts(frozenset(), 4) == (5, 0)
    assert starts(frozenset({Part("ffn", 3), Part("layer", 4)}), 4) == (3, 0)
    assert starts(frozenset({Part("embeddings"), Part("layer", 1), Part("attention", 2)}), 4) == (0, 2)
    assert starts(frozenset({Part("embeddings"), *(Part("layer", j) for j in range(1, 5))}), 4) == (0, 5)


def test_a_family_without_the_bert_block_layout_runs_full_forwards(tmp_path):
    base, tuned, batches = _setup(tmp_path, "deberta-v2")
    units, _ = plan_revert_units(tuned, heads=False)
    cached, naive, ran = _both(lambda s, m: sweep_units(tuned, Revert(base), batches, s, units, method=m), tuned,
                               [u.key for u in units])
    _assert_same(cached, naive)
    assert ran["cached"] == ran["naive"] and ran["cached"][0] == "naive"
    # DeBERTa's relative embeddings lie outside the blocks: a piece there counts as layer 0
    assert first_layer(tuned, ["encoder.rel_embeddings.weight", "encoder.layer.1.output.dense.weight"]) == 0
    assert first_layer(tuned, ["encoder.layer.1.output.dense.weight"]) == 2
