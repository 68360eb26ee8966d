"""Contribution maps (norm, rollout, value zeroing) against a recomputation by hand from the model's tensors."""
import pytest
import torch
from transformers import BertModel

from bertology.activations.contributions import check_measures, contribution_maps, norm_map
from bertology.errors import BertologyError
from bertology.testing import tiny_config

ALL = ("weights", "norm", "norm_residual", "rollout", "value_zeroing", "alti")
# in float64 (value zeroing's cosine distances are ~1e-5, so 1 - cos in float32 keeps 2 digits): sums of
# 32-wide products and LayerNorms of order-1 values agree to ~1e-15; 1e-9 leaves room for the 1 - cos step
TOL = 1e-9


@pytest.fixture(scope="module")
def model_and_batch():
    torch.manual_seed(0)
    model = BertModel(tiny_config()).eval().double()
    ids = torch.randint(5, 40, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # a padded row: padded keys get no share
    tensors = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    with torch.no_grad():
        out = model(**tensors, output_hidden_states=True, output_attentions=True)
        maps = contribution_maps(model, tensors, ALL)
    return model, tensors, out, maps


def _by_hand_norm(model, out, layer, mask):
    """||alpha_ij f(x_j)|| with f from the value and output weights, rows over real keys summing to 1."""
    att = model.encoder.layer[layer - 1].attention
    x = out.hidden_states[layer - 1]
    h, d = model.config.num_attention_heads, model.config.hidden_size // model.config.num_attention_heads
    rows = []
    for head in range(h):
        cols = slice(head * d, (head + 1) * d)
        v = x @ att.self.value.weight[cols].T + att.self.value.bias[cols]
        f = v @ att.output.dense.weight[:, cols].T
        scores = out.attentions[layer - 1][:, head] * f.norm(dim=-1)[:, None, :] * mask[:, None, :]
        rows.append(scores / scores.sum(-1, keepdim=True))
    return torch.stack(rows, 1)


def _by_hand_layer(block, x, mask, zero: int | None):
    """BERT block ``block`` on ``x`` [T, D] with key mask ``mask`` [T]; token ``zero``'s value vectors zeroed."""
    s, h = block.attention.self, block.attention.self.num_attention_heads
    d = x.shape[-1] // h
    q = (x @ s.query.weight.T + s.query.bias).view(-1, h, d).transpose(0, 1)
    k = (x @ s.key.weight.T + s.key.bias).view(-1, h, d).transpose(0, 1)
    v = (x @ s.value.weight.T + s.value.bias).view(-1, h, d).transpose(0, 1).clone()
    if zero is not None:
        v[:, zero] = 0
    scores = q @ k.transpose(1, 2) / d ** 0.5 + (1 - mask[None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
    ctx = (scores.softmax(-1) @ v).transpose(0, 1).reshape(-1, h * d)
    o = block.attention.output
    a = o.LayerNorm(o.dense(ctx) + x)
    return block.output.LayerNorm(block.output.dense(block.intermediate(a)) + a)


def test_weights_are_the_attention_probabilities(model_and_batch):
    _, _, out, maps = model_and_batch
    for layer in (1, 2):
        assert torch.equal(maps["weights"][layer], out.attentions[layer - 1])


def test_norm_equals_the_definition(model_and_batch):
    model, tensors, out, maps = model_and_batch
    for layer in (1, 2):
        ref = _by_hand_norm(model, out, layer, tensors["attention_mask"])
        torch.testing.assert_close(maps["norm"][layer], ref, atol=TOL, rtol=TOL)


def test_rollout_equals_the_product_of_mixed_maps(model_and_batch):
    _, tensors, out, maps = model_and_batch
    keep = tensors["attention_mask"][:, None, :].double()
    rolled = None
    for layer in (1, 2):
        a = 0.5 * out.attentions[layer - 1].mean(1) + 0.5 * torch.eye(7, dtype=torch.float64)
        a = a * keep
        a = a / a.sum(-1, keepdim=True)
        rolled = a if rolled is None else torch.bmm(a, rolled)
        torch.testing.assert_close(maps["rollout"][layer][:, 0], rolled, atol=TOL, rtol=TOL)


def test_value_zeroing_equals_layer_reruns_by_hand(model_and_batch):
    model, tensors, out, maps = model_and_batch
    mask = tensors["attention_mask"]
    for layer in (1, 2):
        block = model.encoder.layer[layer - 1]
        for b in range(2):
            x = out.hidden_states[layer - 1][b]
            with torch.no_grad():
                orig = _by_hand_layer(block, x, mask[b], None)
                dist = torch.stack([1 - torch.cosine_similarity(_by_hand_layer(block, x, mask[b], j), orig, dim=-1)
                                    for j in range(7)], -1) * mask[b][None, :]
            real = int(mask[b].sum())  # padded query rows are no one's output
            ref = (dist / dist.sum(-1, keepdim=True))[:real]
            torch.testing.assert_close(maps["value_zeroing"][layer][b, 0, :real], ref, atol=TOL, rtol=TOL)


def test_every_map_has_rows_summing_to_one_and_no_mass_on_padding(model_and_batch):
    _, tensors, _, maps = model_and_batch
    for measure in ALL:
        for layer in (1, 2):
            m = maps[measure][layer]
            torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:-1], dtype=m.dtype), atol=TOL, rtol=TOL)
            assert float(m[1, ..., 5:].abs().max()) == 0.0, measure


def test_a_head_on_a_zero_norm_value_gets_share_one_under_weights_and_zero_under_norm():
    probs = torch.zeros(1, 1, 3, 3)
    probs[..., 0] = 1.0  # every query puts all its attention on token 0
    vectors = torch.ones(1, 1, 3, 4)
    vectors[:, :, 0] = 0.0  # token 0's f(x) is the zero vector
    norm = norm_map(probs, vectors, torch.ones(1, 3))
    assert float(probs[..., 0].min()) == 1.0
    assert float(norm[..., 0].abs().max()) == 0.0
    # nearly all of it (0.98): the rest, on vectors of norm 2, carries the whole contribution
    probs = torch.tensor([0.98, 0.01, 0.01]).expand(1, 1, 3, 3)
    norm = norm_map(probs, vectors, torch.ones(1, 3))
    torch.testing.assert_close(norm[0, 0], torch.tensor([0.0, 0.5, 0.5]).expand(3, 3))


def test_unknown_or_repeated_measures_are_refused():
    with pytest.raises(BertologyError, match="unknown attention measure 'flow'"):
        check_measures(["weights", "flow"])
    with pytest.raises(BertologyError, match="repeat"):
        check_measures(["norm", "norm"])


def test_value_zeroing_in_float16_is_finite_and_its_rows_sum_to_one(identical_pair):
    """float16 cannot hold the row normalisation's epsilon: the distances are taken in float32, so a row whose
    zeroings change nothing at float16 precision is 0 rather than 0/0."""
    from bertology.models.pair import ModelPair
    from bertology.testing import SENTENCES

    pair = ModelPair.load(*map(str, identical_pair))
    model = pair.base.model.half()
    t = dict(pair.tokenizer(SENTENCES[:6], padding=True, return_tensors="pt"))
    with torch.inference_mode():
        maps = contribution_maps(model, t, ("value_zeroing",))["value_zeroing"]
    real = t["attention_mask"].bool()
    for layer in maps[1:]:
        assert layer.dtype == torch.float32 and torch.isfinite(layer).all()
        sums = layer[:, 0].sum(-1)[real]  # a row of real keys sums to 1, or to 0 when no zeroing moved it
        assert ((sums.abs() < 1e-6) | ((sums - 1).abs() < 1e-5)).all()  # float32 sums of <= 15 shares


def test_norm_residual_and_alti_in_float16_are_float32_and_match_the_float32_model(identical_pair):
    """A float16 model's maps are computed in float32 from its float16 tensors: finite, rows of 1, and within float16
    rounding of the float32 model's maps: shares <= 1 moved by the 2^-11 (4.9e-4) relative rounding of the activations
    for norm_residual (measured 5e-5); alti subtracts two L1 norms of similar size (||y_i||_1 - ||y_i - T_i(x_i)||_1),
    which amplifies that rounding about tenfold, and multiplies layers up (measured 4.9e-3 at layer 2)."""
    from bertology.models.pair import ModelPair
    from bertology.testing import SENTENCES

    pair = ModelPair.load(*map(str, identical_pair))
    t = dict(pair.tokenizer(SENTENCES[:6], padding=True, return_tensors="pt"))
    measures = ("norm_residual", "alti")
    with torch.inference_mode():
        full = contribution_maps(pair.base.model, t, measures)
        half = contribution_maps(pair.base.model.half(), t, measures)
    real = t["attention_mask"].bool()
    for measure in measures:
        for layer, m in enumerate(half[measure][1:], 1):
            assert m.dtype == torch.float32 and torch.isfinite(m).all()
            sums = m[:, 0].sum(-1)[real]
            torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)
            atol = 1e-3 if measure == "norm_residual" else 2e-2
            torch.testing.assert_close(m, full[measure][layer], atol=atol, rtol=0)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_head_norms_by_the_gram_matrix_equal_the_vectors_norms(dtype, tol):
    """``||v W_O^h||`` from ``v G_h v^T`` equals the norm of the built vector; a zero value vector has norm 0.
    (float32: the squared norm's rounding is ~1e-7 relative, its square root's half that; 1e-5 leaves room.)"""
    from bertology.activations.contributions import head_norms, head_vectors

    torch.manual_seed(0)
    x = torch.randn(2, 5, 16, dtype=dtype)
    weight, bias, out = torch.randn(16, 16, dtype=dtype), torch.randn(16, dtype=dtype), torch.randn(16, 16, dtype=dtype)
    x[0, 2] = torch.linalg.solve(weight, -bias)  # token 2 of example 0: its value vector x W_V + b_V is zero
    norms = head_norms(x, (weight, bias), out, heads=4)
    ref = head_vectors(x, (weight, bias), out, heads=4).norm(dim=-1)
    torch.testing.assert_close(norms, ref, atol=tol, rtol=tol)
    # what is left of the zero vector is the solve's rounding: far below the other tokens' norms (~10 here)
    assert float(norms[0, :, 2].max()) < 1e-4 * float(ref.mean())
