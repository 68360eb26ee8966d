"""Interventions as objects: the registry names the CLI's modes, a head mask's ``apply`` run by the generic sweep equals
the batched head sweep exactly, ``apply`` restores the model, and a toy intervention defined here (no other file
edited) runs through the sweep, the summary and the report's ablation section."""
from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from bertology.config import ABLATION_MODES
from bertology.data.corpus import Corpus, Example
from bertology.data.encode import encode_corpus
from bertology.errors import BertologyError
from bertology.experiments.ablation import AblationSettings, mode_summary, summary
from bertology.experiments.ablation_sweep import run_ablation
from bertology.experiments.ablation_units import SweepPlan, Unit
from bertology.experiments.intervention_sweep import run_intervention
from bertology.experiments.interventions import (
    INTERVENTIONS, HeadMask, Intervention, Revert, intervention, registered, words_of,
)
from bertology.experiments.scoring import HeadScoring, head_means
from bertology.models import sites
from bertology.models.loading import load_model
from bertology.testing import SENTENCES, move_every_weight, save_tiny_family, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def _pair(tmp_path):
    folder = save_tiny_family(tmp_path / "bert", "bert")
    base = load_model(folder).model
    torch.manual_seed(1)
    tuned = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2, attn_implementation="eager").eval()
    move_every_weight(tuned.parameters())
    with torch.no_grad():  # a classifier whose predictions vary over the sentences (not a degenerate one):
        # the tiny model's pooled outputs differ little, so a large weight and a bias centring them on the sentences
        pooled = tuned.bert(**tiny_tokenizer()(SENTENCES, padding=True, return_tensors="pt")).pooler_output
        tuned.classifier.weight.normal_(0.0, 300.0, generator=torch.Generator().manual_seed(2))
        tuned.classifier.bias.copy_(-(tuned.classifier.weight @ pooled.mean(0)))
    return base, tuned


def _encoded(tuned):
    """Every sentence twice, labelled by the tuned model's own prediction (intact accuracy 1: a unit can only hurt)."""
    tok = tiny_tokenizer()
    texts = SENTENCES * 2
    with torch.inference_mode():
        pred = tuned(**tok(texts, padding=True, return_tensors="pt")).logits.argmax(-1).tolist()
    labels = pred
    corpus = Corpus([Example(t, label=str(y)) for t, y in zip(texts, labels)], source="test")
    return encode_corpus(corpus, tok, 64), np.array(labels)


def test_the_registry_names_every_mode_the_cli_offers():
    assert tuple(INTERVENTIONS) == ABLATION_MODES
    assert [i.name for i in INTERVENTIONS.values()] == list(ABLATION_MODES)
    assert {n for n, i in INTERVENTIONS.items() if i.needs_base} == {"revert", "transplant"}
    assert {n for n, i in INTERVENTIONS.items() if i.head_importance} == {"uniform", "zero", "mean"}
    assert intervention("transplant").table == "transplant" and intervention("revert").table == "ablation"
    assert words_of("revert").noun == "revert" and words_of("something new").noun == "removal"
    with pytest.raises(BertologyError, match="must be one of uniform, zero, mean, revert, transplant"):
        intervention("graft")


def test_layer_modes_are_read_from_the_intervention():
    assert AblationSettings(mode="revert").layer_modes == ("attention", "ffn", "layer", "embeddings")
    assert AblationSettings(mode="zero").layer_modes == ("skip", "heads")
    assert AblationSettings(mode="transplant").layer_modes == ()
    with pytest.raises(BertologyError, match="uniform, zero and mean take skip, heads or none"):
        AblationSettings(mode="mean", layer_modes=("ffn",))
    with pytest.raises(BertologyError, match="revert takes attention, ffn, layer, embeddings or none"):
        AblationSettings(mode="revert", layer_modes=("skip",))
    with pytest.raises(BertologyError, match="needs the base model"):
        Revert().bound(None)


@pytest.mark.parametrize("name", ["zero", "mean"])
def test_a_head_mask_applied_unit_by_unit_equals_the_batched_head_sweep(tmp_path, name):
    """The generic sweep runs HeadMask.apply per unit (a full forward each); the head sweep replays and caches:
    the same per-example records, so the same table, value for value."""
    _, tuned = _pair(tmp_path)
    encoded, labels = _encoded(tuned)
    scoring = HeadScoring.for_tokenizer(tiny_tokenizer(), mode=name, batch_size=8)
    fast = run_ablation(tuned, encoded, labels, scoring, n_bootstrap=40)
    means = None
    if name == "mean":  # the head sweep's means: over the scored batches
        from bertology.experiments.scoring import classifier_batches

        means = head_means(tuned, classifier_batches(tuned, encoded, labels, scoring))
    mask = HeadMask(name, means=means)
    slow = run_intervention(tuned, mask, encoded, labels, scoring, n_bootstrap=40, sweep=SweepPlan(method="naive"))
    pd.testing.assert_frame_equal(slow.table, fast.table, check_exact=True)
    assert not (fast.table["delta"] == 0).all()  # the masks change the predictions (else equality proves nothing)


def test_apply_restores_the_model_even_when_the_body_raises(tmp_path):
    base, tuned = _pair(tmp_path)
    before = {k: v.clone() for k, v in tuned.state_dict().items()}
    for how, unit in ((Revert(base), Unit("layer", 2, -1, "ffn")), (HeadMask("zero"), Unit("head", 1, 0))):
        with pytest.raises(RuntimeError), how.apply(tuned, unit):
            raise RuntimeError("inside")
        assert all(torch.equal(before[k], v) for k, v in tuned.state_dict().items())
        assert not any(m._forward_pre_hooks or m._forward_hooks for m in tuned.modules())


@dataclass(frozen=True)
class ScaleFFN(Intervention):
    """A toy intervention defined in the test: one layer's feed-forward output scaled by ``factor``."""

    factor: float = 0.0
    name: str = "scale_ffn"

    def units(self, model, sweep=SweepPlan()):
        return [Unit("layer", layer, -1, "ffn") for layer in range(1, sites.num_layers(model) + 1)]

    @contextmanager
    def apply(self, model, unit):
        dense = sites.block(model, unit.layer).output.dense
        handle = dense.register_forward_hook(lambda _m, _i, out: out * self.factor)
        try:
            yield
        finally:
            handle.remove()

    def start(self, model, unit):
        return sites.num_layers(model) + 1 if unit.target == "intact" else unit.layer


def test_a_toy_intervention_runs_through_the_sweep_summary_and_report(tmp_path):
    _, tuned = _pair(tmp_path)
    encoded, labels = _encoded(tuned)
    scoring = HeadScoring.for_tokenizer(tiny_tokenizer(), batch_size=8)
    toy = ScaleFFN(0.0)
    result = run_intervention(tuned, toy, encoded, labels, scoring, n_bootstrap=30)
    t = result.table
    assert result.params["method"] == "cached" and set(t["mode"]) == {"scale_ffn"}
    assert list(t.loc[t["metric"] == "accuracy", "label"]) == ["intact", "L1 feed-forward", "L2 feed-forward"]
    # independently: a copy with layer 2's feed-forward output weights and bias zeroed, scored by a plain forward
    hand = copy.deepcopy(tuned)
    with torch.no_grad():
        hand.bert.encoder.layer[1].output.dense.weight.zero_()
        hand.bert.encoder.layer[1].output.dense.bias.zero_()
    tok = tiny_tokenizer()
    texts = SENTENCES * 2  # corpus order, as the labels
    with torch.inference_mode():
        pred = hand(**tok(texts, padding=True, return_tensors="pt")).logits.argmax(-1).numpy()
    acc = t[(t["metric"] == "accuracy")].set_index("label")["value"]
    np.testing.assert_array_equal(result.per_example["layer-ffn-L2"]["pred"], pred)
    # the table keeps accuracy in float32: equal to the hand count to float32's resolution (2**-24 relative)
    assert acc["L2 feed-forward"] == pytest.approx(float((pred == labels).mean()), abs=2 ** -23)
    assert not np.array_equal(result.per_example["layer-ffn-L2"]["loss"], result.per_example["intact"]["loss"])
    with registered(toy):
        lines = summary({"ablation": t})
        assert "removal hurts beyond the 95% CI" in lines and "mode scale_ffn" in lines
        assert mode_summary({"ablation": t}).splitlines()[0].startswith("intact:")
        from bertology.report.sections.ablation import ablation_section, head_modes
        from bertology.report.sections.base import Figures

        assert head_modes({"ablation": t}) == ["scale_ffn"]
        warnings: list[str] = []
        section = ablation_section({"ablation": t}, Figures(tmp_path / "run", warnings), [], warnings)
        assert ("Mode", "scale_ffn") in section["facts"] and not warnings
        assert [f["name"] for f in section["figures"]] == ["ablation_layers_accuracy"]  # its layer units, drawn
    assert "scale_ffn" not in INTERVENTIONS
