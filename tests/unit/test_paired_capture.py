"""The paired capture against each model's own ``output_hidden_states`` / ``output_attentions`` on two families, its
bounds (examples, layers, what), its size estimate against what it holds, and its refusals."""
import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

import bertology as bt
from bertology.activations.capture import estimate_bytes
from bertology.errors import BertologyError
from bertology.models.pair import ModelPair
from bertology.testing import save_tiny_family
from bertology.testing.tokenizers import tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["the cat sat on the mat .", "a good movie", "i like the story very much", "john saw mary"]
#: float32 activations of order 1: the cache's batch is padded, the reference runs each sentence alone, so the two
#: differ by float32 rounding of the same arithmetic (~1e-7 relative), far below 1e-5
TOL = 1e-5


#: two families, each with a tokenizer of its own kind (WordPiece; RoBERTa's byte-level BPE)
FAMILIES = {"bert": "wordpiece", "roberta": "bpe"}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    tok = tiny_tokenizer(FAMILIES[request.param], root / "tokenizer")
    return (str(save_tiny_family(root / "base", request.param, tokenizer=tok, seed=0)),
            str(save_tiny_family(root / "tuned", request.param, tokenizer=tok, seed=1)))


def _own_outputs(folder, text):
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(**tok(text, return_tensors="pt"), output_hidden_states=True, output_attentions=True)
    return out.hidden_states, out.attentions


def test_the_capture_equals_each_models_own_outputs(pair):
    cache = bt.capture(*pair, TEXTS)
    assert cache.n_examples == len(TEXTS) and cache.texts == TEXTS
    for side, folder in enumerate(pair):
        for i, text in enumerate(TEXTS):
            hidden, maps = _own_outputs(folder, text)
            n = hidden[0].shape[1]
            assert int(cache.mask[i].sum()) == n
            for layer, h in enumerate(hidden):
                got = cache["hidden_states", layer][side][i]
                torch.testing.assert_close(got[:n], h[0], atol=TOL, rtol=0)
                assert not got[n:].any()  # padding is zero
            for layer, a in enumerate(maps, start=1):
                got = cache["attentions", layer][side][i]
                torch.testing.assert_close(got[:, :n, :n], a[0], atol=TOL, rtol=0)
                assert not got[:, n:].any() and not got[:, :, n:].any()
    tok = AutoTokenizer.from_pretrained(pair[0])
    assert cache.tokens == [tok.convert_ids_to_tokens(tok(t)["input_ids"]) for t in TEXTS]
    assert not torch.equal(cache["hidden_states", 2][0], cache["hidden_states", 2][1])  # two different models


def test_the_size_estimate_is_what_the_cache_holds(pair):
    for layers, what in ((None, ("hidden_states", "attentions")), ([0, 2], "attentions"), ([1], "hidden_states")):
        cache = bt.capture(*pair, TEXTS, layers=layers, what=what)
        kinds = (what,) if isinstance(what, str) else what
        chosen = range(3) if layers is None else layers
        estimate = estimate_bytes(cache.n_examples, cache.mask.shape[1], ModelPair.load(*pair), chosen, kinds)
        assert estimate == cache.nbytes > 0


def test_layers_what_and_max_examples_bound_the_capture(pair):
    cache = bt.capture(*pair, TEXTS * 3, layers=[0, 2], what="hidden_states", max_examples=5)
    assert cache.n_examples == 5 and cache.keys() == [("hidden_states", 0), ("hidden_states", 2)]
    with pytest.raises(KeyError, match="attentions start at layer 1"):
        cache["attentions", 1]
    maps = bt.capture(*pair, TEXTS, layers=[0, 1], what=["attentions"])
    assert maps.keys() == [("attentions", 1)]  # layer 0 has no attention map


def test_the_batch_is_what_an_analysis_update_receives(pair):
    cache = bt.capture(*pair, TEXTS)
    batch = cache.batch()
    assert batch.size == len(TEXTS) and batch.base.attentions[0] is None
    assert batch.tuned.hidden_states[1] is cache["hidden_states", 1][1]
    np.testing.assert_array_equal(batch.lengths.numpy(), [len(t) for t in cache.tokens])


def test_a_capture_too_large_for_its_limit_is_refused_with_its_estimate(pair):
    with pytest.raises(BertologyError, match=r"would hold 0\.\d+ MB in memory \(4 examples padded to \d+ tokens"):
        bt.capture(*pair, TEXTS, memory_limit_gb=1e-6)


@pytest.mark.parametrize("kwargs, why", [
    ({"layers": [3]}, "layers are 0"),
    ({"what": "logits"}, "what names activations"),
    ({"what": ()}, "what names activations"),
    ({"max_examples": 0}, "at least 1"),
    ({"max_examples": None}, "at least 1"),
])
def test_what_cannot_be_captured_is_refused(pair, kwargs, why):
    with pytest.raises(BertologyError, match=why):
        bt.capture(*pair, TEXTS, **kwargs)
