"""Tracking reads the attention weights only: asking it for contribution measures is refused in one line, not
silently answered with the weights."""
import pytest

from bertology.data.corpus import Corpus
from bertology.errors import BertologyError
from bertology.integrations.tracker import CallbackSettings, Tracker
from bertology.models.loading import load_model
from bertology.testing import SENTENCES, save_tiny_bert


def test_attention_measures_are_refused_by_tracking(tmp_path):
    loaded = load_model(save_tiny_bert(tmp_path / "m"))
    tracker = Tracker(CallbackSettings(analyses=("attention_change",)), Corpus.from_list(SENTENCES),
                      analysis_settings={"attention_measures": ("weights", "norm")})
    with pytest.raises(BertologyError, match="tracking reads the attention weights only"):
        tracker.prepare(loaded.encoder, loaded.tokenizer)
    plain = Tracker(CallbackSettings(analyses=("attention_change",)), Corpus.from_list(SENTENCES))
    plain.prepare(loaded.encoder, loaded.tokenizer)  # the default (weights) is what tracking reads
    assert plain.ready
