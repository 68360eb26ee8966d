import numpy as np
import pytest
import torch

from bertology.activations.extract import run_analyses
from bertology.activations.store import ActivationStore
from bertology.data.corpus import Corpus
from bertology.data.encode import encode_corpus
from bertology.errors import BertologyError
from bertology.models.pair import ModelPair
from bertology.testing import SENTENCES


def test_store_round_trip_and_fingerprint_check(planted_pair, identical_pair, tmp_path):
    pair = ModelPair.load(*map(str, planted_pair))
    enc = encode_corpus(Corpus.from_list(SENTENCES), pair.tokenizer)
    store = ActivationStore.create(tmp_path / "store", pair, enc)
    run_analyses(pair, enc, [], batch_size=4, store=store)
    with pytest.raises(BertologyError, match="incomplete"):
        ActivationStore.open(tmp_path / "store")
    store.close()
    opened = ActivationStore.open(tmp_path / "store", pair, enc)
    ex, pos, vec = opened.hidden_states("tuned", 2)
    assert len(ex) == enc.n_tokens and vec.dtype == np.float16
    # the stored vector of example 3, position 2 equals a direct forward
    i = np.nonzero((ex == 3) & (pos == 2))[0][0]
    with torch.inference_mode():
        ref = pair.tuned.model(**pair.tokenizer(SENTENCES[3], return_tensors="pt"), output_hidden_states=True).hidden_states[2][0, 2]
    np.testing.assert_allclose(vec[i].astype(np.float32), ref.numpy(), atol=2e-2, rtol=1e-2)
    other = ModelPair.load(*map(str, identical_pair))
    with pytest.raises(BertologyError, match="other models or data"):
        ActivationStore.open(tmp_path / "store", other, enc)
