"""Weight-space change against independent computations: numpy on hand-extracted state_dict tensors, intruder
dimensions on constructed matrices whose answer is known, every family's layout against the adapter's own
value and output projections, and the seed-noise rule on real tiny models with one planted change."""
from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModel

from bertology.experiments.weight_change import WeightSettings, weight_change_table
from bertology.metrics.weights import intruder_alignment, matrix_change
from bertology.models import sites
from bertology.studies.noise import corpus_study_tables
from bertology.testing import FAMILY_CONFIGS, tiny_family_config, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

#: float32 SVD of matrices of size ~0.1-1: singular values to ~1e-6 relative to the largest.
RTOL = 2e-5


def _model(model_type: str, seed: int = 0, **overrides) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = tiny_family_config(model_type, tiny_tokenizer(), initializer_range=0.3, **overrides)
    model = AutoModel.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():  # biases start at zero: give them a size, so their relative change exists
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
    return model


def _copy(model: torch.nn.Module) -> torch.nn.Module:
    other = type(model)(copy.deepcopy(model.config)).eval()
    other.load_state_dict(model.state_dict())
    return other


def _perturbed(model: torch.nn.Module, scale: float = 0.05, seed: int = 1) -> torch.nn.Module:
    out = _copy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return out


def _numpy_numbers(b: np.ndarray, t: np.ndarray, k: int = 10) -> dict:
    """The definitions, in float64 numpy, independent of the code under test."""
    d = t - b
    s = np.linalg.svd(d, compute_uv=False)
    u_b = np.linalg.svd(b, full_matrices=False)[0]
    u_t = np.linalg.svd(t, full_matrices=False)[0][:, :k]
    align = np.abs(u_t.T @ u_b).max(axis=1)
    return {"relative_change": np.linalg.norm(d) / np.linalg.norm(b), "stable_rank": (s**2).sum() / s[0] ** 2,
            "sv": s[:3], "align": align}


#: (family, state_dict name of one layer-2 matrix, the table's module): hand-written names, not the adapter's.
HAND = [
    ("bert", "encoder.layer.1.attention.self.query.weight", "query"),
    ("bert", "encoder.layer.1.output.dense.weight", "ffn_out"),
    ("distilbert", "transformer.layer.1.attention.out_lin.weight", "attention_output"),
    ("distilbert", "transformer.layer.1.ffn.lin1.weight", "ffn_in"),
    ("modernbert", "layers.1.mlp.Wo.weight", "ffn_out"),
]


@pytest.mark.parametrize("family,name,module", HAND, ids=[f"{f}-{m}" for f, _, m in HAND])
def test_numbers_match_numpy_on_state_dict_tensors(family, name, module):
    base = _model(family)
    tuned = _perturbed(base)
    table, _ = weight_change_table(base, tuned)
    row = table[(table["layer"] == 2) & (table["module"] == module) & table["head"].isna()].iloc[0]
    b = base.state_dict()[name].double().numpy()
    t = tuned.state_dict()[name].double().numpy()
    want = _numpy_numbers(b, t)
    assert row["relative_change"] == pytest.approx(want["relative_change"], rel=1e-9)  # float64 norms
    assert row["stable_rank"] == pytest.approx(want["stable_rank"], rel=RTOL)
    assert [row[f"delta_sv_{i}"] for i in (1, 2, 3)] == pytest.approx(list(want["sv"]), rel=RTOL)
    assert row["alignment_min"] == pytest.approx(want["align"].min(), abs=1e-4)
    assert not np.any(np.abs(want["align"] - 0.5) < 1e-3)  # no vector sits on the threshold: the count is exact
    assert row["intruders"] == int((want["align"] < 0.5).sum()) and row["top_k"] == 10
    assert row["shape"] == "x".join(map(str, b.shape))


def test_head_slices_match_numpy_rows_and_columns():
    base = _model("bert")
    tuned = _perturbed(base)
    table, _ = weight_change_table(base, tuned)
    sd_b, sd_t, d = base.state_dict(), tuned.state_dict(), 32 // 4
    for module, name, cut in (("value", "encoder.layer.0.attention.self.value.weight", lambda w, h: w[h * d:(h + 1) * d]),
                              ("attention_output", "encoder.layer.0.attention.output.dense.weight",
                               lambda w, h: w[:, h * d:(h + 1) * d])):
        for h in range(4):
            row = table[(table["layer"] == 1) & (table["module"] == module) & (table["head"] == h)].iloc[0]
            want = _numpy_numbers(cut(sd_b[name].double().numpy(), h), cut(sd_t[name].double().numpy(), h))
            assert row["relative_change"] == pytest.approx(want["relative_change"], rel=1e-9)
            assert row["delta_sv_1"] == pytest.approx(want["sv"][0], rel=RTOL)
            assert row["stable_rank"] == pytest.approx(want["stable_rank"], rel=RTOL)
    bias = table[(table["layer"] == 1) & (table["module"] == "value") & (table["head"] == 2)]["bias_change"].iloc[0]
    b, t = (m.state_dict()["encoder.layer.0.attention.self.value.bias"][2 * d:3 * d].double() for m in (base, tuned))
    assert bias == pytest.approx(float((t - b).norm() / b.norm()), rel=1e-9)


def _orthonormal(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    return np.linalg.qr(rng.standard_normal((n, k)))[0]


def _spiked(spike: str) -> tuple[torch.Tensor, torch.Tensor, float]:
    """A 48 x 24 base with singular values 10..1 and a tuned copy with one rank-one change of size 100.

    ``orthogonal``: the change's left vector is orthogonal to the base's column space and its right vector is
    the base's least right singular vector, so the tuned matrix's top singular vector (value sqrt(1 + 100^2))
    has |cosine| 0.01 with every base singular vector: exactly one intruder. ``aligned``: the change is along
    the base's top singular pair: the top vector is the base's own, no intruder.
    """
    rng = np.random.default_rng(0)
    q = _orthonormal(rng, 48, 25)
    u, extra, v = q[:, :24], q[:, 24], _orthonormal(rng, 24, 24)
    s = np.linspace(10, 1, 24)
    base = (u * s) @ v.T
    left, right = (extra, v[:, -1]) if spike == "orthogonal" else (u[:, 0], v[:, 0])
    tuned = base + 100.0 * np.outer(left, right)
    return torch.tensor(base, dtype=torch.float32), torch.tensor(tuned, dtype=torch.float32), float(np.linalg.norm(base))


def test_an_orthogonal_rank_one_spike_is_exactly_one_intruder():
    base, tuned, norm = _spiked("orthogonal")
    c = matrix_change(base, tuned, k=10, epsilon=0.5)
    assert c.intruders == 1 and c.top_k == 10
    align = intruder_alignment(base, tuned, 10)
    assert float(align[0]) == pytest.approx(1 / np.sqrt(1 + 100**2), abs=1e-5)  # the spike, ranked first
    assert torch.all(align[1:] > 1 - 1e-4)  # the others are the base's own vectors
    assert c.stable_rank == pytest.approx(1.0, abs=1e-5)  # a rank-one change
    assert c.singular_values[0] == pytest.approx(100.0, rel=1e-6) and max(c.singular_values[1:]) < 1e-4
    assert c.relative_change == pytest.approx(100.0 / norm, rel=1e-6)  # the matrices were rounded to float32


def test_a_spike_along_the_base_s_top_direction_and_no_change_give_no_intruder():
    base, tuned, _ = _spiked("aligned")
    assert matrix_change(base, tuned).intruders == 0
    same = matrix_change(base, base.clone())
    assert (same.intruders, same.relative_change, same.delta_norm, same.stable_rank) == (0, 0.0, 0.0, None)
    assert matrix_change(base, tuned, k=3).top_k == 3


@pytest.mark.parametrize("model_type", list(FAMILY_CONFIGS))
def test_every_family_names_its_units_and_heads_through_the_adapter(model_type):
    """A change planted through the adapter's own value and output projections (checked against hand-written
    module paths in tests/families/test_adapters.py) shows up at that layer, module and head only."""
    base = _model(model_type)
    same, info = weight_change_table(base, _copy(base))
    assert (same["relative_change"].dropna() == 0).all() and (same["intruders"].dropna() == 0).all()
    assert {"query", "key", "value", "attention_output", "ffn_in", "ffn_out", "ffn_norm", "word_embeddings"} <= set(same["module"])
    heads = same[same["head"].notna()]
    assert set(heads["module"]) == {"query", "key", "value", "attention_output"} and set(heads["head"]) == {0, 1, 2, 3}
    layer = 2
    tuned = _copy(base)
    d = sites.head_size(tuned)
    with torch.no_grad():
        sites.value_projection(tuned, layer)[0][d:2 * d] += 0.5       # head 1's value rows
        sites.out_proj(tuned, layer).weight[:, 3 * d:4 * d] += 0.5    # head 3's output columns
    table, _ = weight_change_table(base, tuned)
    moved = table[table["relative_change"] > 0]
    first = 1 if model_type == "albert" else layer  # ALBERT: one shared block, reported at its first depth
    want = {(first, "value", None), (first, "value", 1), (first, "attention_output", None), (first, "attention_output", 3)}
    assert {(r.layer, r.module, None if pd.isna(r.head) else r.head) for r in moved.itertuples()} == want
    if model_type == "albert":
        assert set(table["layer"]) == {0, 1} and (table.loc[table["layer"] == 1, "shared_by"] == 3).all()
    assert "note" in table and not info["notes"]


def test_a_resized_vocabulary_compares_the_rows_both_models_have():
    base = _model("bert")
    tuned = _copy(base)
    tuned.resize_token_embeddings(base.config.vocab_size + 8, mean_resizing=False)
    table, info = weight_change_table(base, tuned)
    row = table[table["module"] == "word_embeddings"].iloc[0]
    assert row["relative_change"] == 0.0 and "resized table" in row["note"] and f"rows 0-{base.config.vocab_size - 1}" in row["note"]
    assert row["shape"] == f"{base.config.vocab_size}x32" and info["notes"] == [row["note"]]


def test_other_shape_differences_are_refused_unit_by_unit():
    base, tuned = _model("bert"), _model("bert", intermediate_size=48)
    table, _ = weight_change_table(base, tuned)
    ffn = table[table["module"].isin(["ffn_in", "ffn_out"])]
    assert ffn["relative_change"].isna().all() and ffn["note"].str.startswith("shapes differ (64x32 vs 48x32").sum() == 2
    assert table[table["module"] == "query"]["relative_change"].notna().all()


def test_settings_reach_the_numbers():
    base = _model("bert")
    table, _ = weight_change_table(base, _perturbed(base), WeightSettings(singular_values=5, intruder_k=2,
                                                                           intruder_epsilon=0.999))
    assert {f"delta_sv_{i}" for i in range(1, 6)} <= set(table.columns)
    matrices = table.dropna(subset=["intruders"])
    assert (matrices["top_k"] <= 2).all() and (matrices["intruders"] == matrices["top_k"]).all()  # eps ~1: all


def _study_tables(seeds: int = 3) -> dict[str, pd.DataFrame]:
    """Real tiny models: every seed moves every weight a little at random; all seeds move layer 2's query a lot."""
    base = _model("bert")
    models = []
    for s in range(seeds):
        tuned = _perturbed(base, scale=0.01, seed=10 + s)
        with torch.no_grad():
            tuned.encoder.layer[1].attention.self.query.weight.add_(0.3)
        models.append(tuned)
    pair = [weight_change_table(base, m)[0].assign(tuned=f"sst2/s{s}", task="sst2", seed=s) for s, m in enumerate(models)]
    seeds_ = [weight_change_table(models[a], models[b])[0].assign(task="sst2", seed_a=a, seed_b=b)
              for a in range(seeds) for b in range(a + 1, seeds)]
    return {"weight_change": pd.concat(pair, ignore_index=True), "seedpair_weight_change": pd.concat(seeds_, ignore_index=True)}


def test_the_seed_noise_rule_reads_weight_change_per_layer_module_and_head():
    study = corpus_study_tables(_study_tables())
    effects = study["study_effects"]
    mine = effects[effects["table"] == "weight_change"]
    assert set(mine["level"]) == {"module", "head"} and set(mine["metric"]) == {"relative_change"}
    assert mine["beyond_noise"].notna().all()  # 3 seeds, 3 seed pairs: every unit is tested
    beyond = set(mine.loc[mine["beyond_noise"].astype(bool), "unit"])
    assert {"L2 query", "L2H0 query", "L2H3 query"} <= beyond
    assert beyond <= {"L2 query"} | {f"L2H{h} query" for h in range(4)}  # seed noise alone is never beyond it
    counts = study["study_counts"]
    assert set(counts.loc[counts["table"] == "weight_change", "level"]) == {"module", "head"}
