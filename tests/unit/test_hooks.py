"""Hooks capture the same tensors the model reports, and never leak."""
import pytest
import torch

from bertology.models.hooks import capture, count_hooks
from bertology.models.loading import load_model


@pytest.fixture()
def tiny(identical_pair):
    return load_model(identical_pair[0])


def _inputs(loaded):
    return loaded.tokenizer(["the cat sat on the mat .", "a dull film"], return_tensors="pt", padding=True)


def test_capture_matches_output_attentions_and_hidden_states(tiny):
    enc = _inputs(tiny)
    with torch.inference_mode():
        ref = tiny.model(**enc, output_attentions=True, output_hidden_states=True)
        with capture(tiny.model) as cap:
            tiny.model(**enc)
    assert len(cap.hidden_states) == len(ref.hidden_states) == 3
    for ours, theirs in zip(cap.hidden_states, ref.hidden_states):
        torch.testing.assert_close(ours, theirs)
    assert cap.attentions[0] is None
    for ours, theirs in zip(cap.attentions[1:], ref.attentions):
        torch.testing.assert_close(ours, theirs)
        assert ours.shape[1] == 4  # heads


def test_no_hook_leaks_even_when_the_body_raises(tiny):
    before = count_hooks(tiny.model)
    with capture(tiny.model):
        assert count_hooks(tiny.model) > before
    assert count_hooks(tiny.model) == before
    with pytest.raises(RuntimeError, match="boom"):
        with capture(tiny.model):
            raise RuntimeError("boom")
    assert count_hooks(tiny.model) == before
