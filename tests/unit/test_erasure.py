"""LEACE erasure: the erased features' class means all equal the overall mean (the guarantee, to float64
rounding), a fresh linear probe falls to the majority rate on held-out words, the hook erases exactly one hidden
state inside the model's own forward pass, and token-probe runs without ``erase`` keep their table and settings."""

import numpy as np
import pytest
import torch

from bertology.errors import BertologyError
from bertology.experiments.ablation_table import Bootstrap
from bertology.experiments.probe_features import FeaturePass
from bertology.experiments.erasure import erase, erased_probe, erasing, fit_eraser
from bertology.experiments.token_probe import COLUMNS, ERASED_COLUMNS, TokenProbeSettings, erasure_warnings, make_probe
from bertology.models.loading import load_model
from bertology.testing import save_tiny_bert

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _planted(n: int, seed: int, k: int = 4, d: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Words of ``k`` labels whose means differ along random directions (linearly readable: a probe scores ~1)."""
    rng = np.random.default_rng(seed)
    means = np.random.default_rng(99).normal(0, 3, size=(k, d))
    y = rng.choice(k, size=n, p=[0.4, 0.3, 0.2, 0.1][:k])
    return means[y] + rng.normal(size=(n, d)), y


def test_erased_class_means_equal_the_overall_mean():
    x, y = _planted(600, 0)
    eraser = fit_eraser(x, y, 4)
    xe = erase(eraser, x)
    overall = xe.mean(0)
    scale = np.abs(x).max()
    for label in range(4):
        # LEACE zeroes the cross-covariance of features and one-hot labels: each class mean is the overall mean
        # (to float64 rounding of sums over 600 rows of values of size ~scale)
        np.testing.assert_allclose(xe[y == label].mean(0), overall, atol=1e-9 * scale * len(x))
    # before erasure the means were far apart: the check above can fail
    assert np.abs(x[y == 0].mean(0) - x[y == 3].mean(0)).max() > 1.0


def test_a_fresh_probe_falls_to_the_majority_rate_on_held_out_words():
    x_tr, y_tr = _planted(800, 1)
    x_te, y_te = _planted(400, 2)
    settings = TokenProbeSettings(tasks="upos")
    before = make_probe(settings, 0).fit(x_tr, y_tr).score(x_te, y_te)
    correct, _ = erased_probe(x_tr, x_te, y_tr, y_te, 4, lambda x, y: make_probe(settings, 0).fit(x, y))
    majority = float((y_te == np.bincount(y_tr).argmax()).mean())
    assert before > 0.95
    assert abs(correct.mean() - majority) <= 0.03


def test_a_constant_feature_stays_constant_for_the_probe():
    """MiniLM's last layer has a constant feature: erasure leaves rounding noise there (~1e-16) that a
    standardising probe would blow up to unit variance; the check flattens it back."""
    from bertology.experiments.erasure import flat_rounding

    x_tr, y_tr = _planted(800, 1)
    x_te, y_te = _planted(400, 2)
    x_tr[:, 3], x_te[:, 3] = 0.7, 0.7
    eraser = fit_eraser(x_tr, y_tr, 4)
    raw = erase(eraser, x_tr)
    assert 0 < raw[:, 3].std() < 1e-9  # the rounding the check must not read
    flat_tr, flat_te = flat_rounding(raw, erase(eraser, x_te))
    assert flat_tr[:, 3].std() == 0 and flat_te[:, 3].std() == 0
    np.testing.assert_array_equal(np.delete(flat_tr, 3, axis=1), np.delete(raw, 3, axis=1))  # nothing else moved
    settings = TokenProbeSettings(tasks="upos")
    correct, _ = erased_probe(x_tr, x_te, y_tr, y_te, 4, lambda x, y: make_probe(settings, 0).fit(x, y))
    assert abs(correct.mean() - float((y_te == np.bincount(y_tr).argmax()).mean())) <= 0.03


def test_refuses_a_single_label():
    with pytest.raises(BertologyError, match="two labels"):
        fit_eraser(np.zeros((5, 3)), np.zeros(5, dtype=int), 1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(save_tiny_bert(tmp_path_factory.mktemp("erasure") / "m", seed=0))


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_the_hook_erases_exactly_one_hidden_state(tiny, layer):
    """What the next block receives (or, after the last block, the model's output) is the erased hidden state;
    nothing below it changes, and the hook is gone on exit."""
    from bertology.models import sites

    model = tiny.encoder
    n = sites.num_layers(model)
    ids = torch.tensor([[2, 7, 9, 11, 3], [2, 8, 3, 0, 0]])
    mask = (ids != 0).long()

    def forward() -> tuple[torch.Tensor, tuple]:
        seen = {}

        def read(_m, args, kwargs) -> None:
            seen.setdefault("x", kwargs["hidden_states"] if "hidden_states" in kwargs else args[0])

        grab = sites.block(model, layer + 1).register_forward_pre_hook(read, with_kwargs=True) if layer < n else None
        try:
            with torch.no_grad():
                out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        finally:
            if grab is not None:
                grab.remove()
        return (seen["x"] if layer < n else out.last_hidden_state), out.hidden_states

    plain_next, plain = forward()
    torch.testing.assert_close(plain_next, plain[layer], rtol=0, atol=0)  # the hidden state the eraser acts on
    hidden = plain[layer].reshape(-1, plain[layer].shape[-1]).double().numpy()
    eraser = fit_eraser(hidden, np.arange(len(hidden)) % 3, 3)
    with erasing(model, layer, eraser):
        erased_next, erased = forward()
    expected = torch.as_tensor(erase(eraser, hidden).reshape(plain[layer].shape), dtype=torch.float32)
    # the hook's float64 arithmetic, cast to float32 like the model's own tensors: equal to one float32 rounding
    torch.testing.assert_close(erased_next, expected, rtol=0, atol=4 * torch.finfo(torch.float32).eps * float(expected.abs().max()))
    assert not torch.allclose(expected, plain[layer])  # the erasure moved something: the check above can fail
    for lower in range(layer):
        assert torch.equal(erased[lower], plain[lower])
    again_next, again = forward()
    assert torch.equal(again_next, plain_next) and all(torch.equal(a, b) for a, b in zip(again, plain))


def test_erase_probes_its_task_and_leaves_old_runs_alone():
    s = TokenProbeSettings(erase="upos")
    assert s.tasks == ("upos",) and s.erase == ("upos",)
    assert "erase" not in TokenProbeSettings(tasks="upos").to_dict()  # earlier token-probe runs keep their fingerprint
    assert TokenProbeSettings(tasks="deprel", erase="upos").tasks == ("deprel", "upos")


def test_token_probes_with_erasure(tiny):
    import pandas as pd

    from tests.unit.test_token_probe import _tagged_corpus
    from bertology.experiments.token_probe import token_probes

    train, test = _tagged_corpus(80, 0), _tagged_corpus(30, 1)
    pass_, boot = FeaturePass(layers=(0, 2)), Bootstrap(n=100)
    table, params = token_probes({"base": tiny}, train, test, TokenProbeSettings(erase="upos", mdl=False),
                                 features=pass_, bootstrap=boot)
    assert list(table.columns[: len(COLUMNS) + len(ERASED_COLUMNS)]) == COLUMNS + ERASED_COLUMNS
    for _, row in table.iterrows():
        assert row["accuracy"] > row["majority_rate"] + 0.2  # the property was there
        assert row["erased_accuracy"] <= row["majority_rate"] + 0.03  # and erasure removed what a probe reads
        assert row["erased_ci_low"] <= row["erased_accuracy"] <= row["erased_ci_high"]
    assert params["erasure"]["warnings"] == []
    plain, _ = token_probes({"base": tiny}, train, test, TokenProbeSettings(tasks="upos", mdl=False),
                            features=pass_, bootstrap=boot)
    assert not set(ERASED_COLUMNS) & set(plain.columns)
    shared = [c for c in plain.columns if c != "not_converged"]
    pd.testing.assert_frame_equal(table[shared], plain[shared])  # erasure adds columns, changes no other number


def test_erasure_warnings_name_the_layers_where_it_failed():
    import pandas as pd

    t = pd.DataFrame({"probe_task": ["upos"] * 2, "model": ["base"] * 2, "layer": [1, 2], "majority_rate": [0.3, 0.3],
                      "erased_accuracy": [0.31, 0.5]})
    (line,) = erasure_warnings(t)
    assert "layer(s) 2 " in line and "base" in line


def test_the_erase_intervention_scores_the_task_with_each_layer_erased(tmp_path):
    """Erase through the intervention sweep: each layer's predictions equal a plain forward with that layer erased by
    hand; the cached path (blocks below reused) equals full forwards; the rows carry the erasure's words."""
    from bertology.experiments.ablation_units import SweepPlan
    from bertology.experiments.intervention_sweep import run_intervention
    from bertology.experiments.interventions import Erase, words_of
    from bertology.experiments.scoring import HeadScoring
    from bertology.testing import SENTENCES, tiny_tokenizer
    from tests.unit.test_interventions import _encoded, _pair

    _, tuned = _pair(tmp_path)
    encoded, labels = _encoded(tuned)
    tok = tiny_tokenizer()
    texts = SENTENCES * 2
    with torch.no_grad():
        hidden = tuned.bert(**tok(texts, padding=True, return_tensors="pt"), output_hidden_states=True).hidden_states
    # an eraser per layer of a made-up property of each token (the token's position parity): something to erase
    mask = tok(texts, padding=True, return_tensors="pt")["attention_mask"].bool()
    parity = (torch.arange(mask.shape[1]).expand_as(mask) % 2)[mask].numpy()
    erasers = {layer: fit_eraser(hidden[layer][mask].double().numpy(), parity, 2) for layer in (0, 1, 2)}
    scoring = HeadScoring.for_tokenizer(tok, batch_size=8)
    cached = run_intervention(tuned, Erase(erasers, "parity"), encoded, labels, scoring, n_bootstrap=30,
                              sweep=SweepPlan(method="cached"))
    naive = run_intervention(tuned, Erase(erasers, "parity"), encoded, labels, scoring, n_bootstrap=30,
                             sweep=SweepPlan(method="naive"))
    assert cached.params["method"] == "cached"
    t = cached.table
    assert set(t["mode"]) == {"erase"}
    assert list(t.loc[t["metric"] == "accuracy", "label"]) == ["intact", "L0 erased", "L1 erased", "L2 erased"]
    for layer in (0, 1, 2):
        key = f"layer-erase-L{layer}"
        np.testing.assert_array_equal(cached.per_example[key]["pred"], naive.per_example[key]["pred"])
        with torch.no_grad(), erasing(tuned, layer, erasers[layer]):
            by_hand = tuned(**tok(texts, padding=True, return_tensors="pt")).logits.argmax(-1).numpy()
        np.testing.assert_array_equal(cached.per_example[key]["pred"], by_hand)
    assert any(not np.array_equal(cached.per_example[f"layer-erase-L{l}"]["loss"], cached.per_example["intact"]["loss"])
               for l in (0, 1, 2))  # the erasure changed something: the checks above can fail
    assert words_of("erase").noun == "erasure"
