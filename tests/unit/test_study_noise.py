"""Seed noise as the yardstick: the rule's error rate, planted effects, single seeds, and the summaries."""
from __future__ import annotations

from itertools import combinations
from math import comb, sqrt

import numpy as np
import pandas as pd
import pytest
from scipy.stats import mannwhitneyu

from bertology.errors import BertologyError
from bertology.studies.noise import attained_level, min_p, study_tables, u_distribution
from bertology.studies.summarise import read_study_tables
from bertology.testing.synthetic import synthetic_study


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    folder = synthetic_study(tmp_path_factory.mktemp("study"), {"sst2": 3, "mrpc": 3, "rte": 1})
    base, seeds = read_study_tables(folder)
    return base, seeds, study_tables(base, seeds)


def _one(df: pd.DataFrame, **where) -> pd.Series:
    mask = np.ones(len(df), bool)
    for k, v in where.items():
        mask &= (df[k] == v).to_numpy()
    rows = df[mask]
    assert len(rows) == 1, (where, len(rows))
    return rows.iloc[0]


# ---------------------------------------------------------------------------------- the error rate
@pytest.mark.parametrize("m,n", [(3, 3), (4, 6), (2, 5), (5, 2)])
def test_u_distribution_matches_scipy_exact_p(m, n):
    """P(U >= u) from our counting recursion equals scipy's exact one-sided p for every u."""
    prob = u_distribution(m, n)
    assert prob.sum() == pytest.approx(1.0, abs=1e-12)
    rng = np.random.default_rng(m * 10 + n)
    for _ in range(20):
        x, y = rng.random(m), rng.random(n)
        u = int((x[:, None] > y[None, :]).sum())
        p = mannwhitneyu(x, y, alternative="greater", method="exact").pvalue
        assert prob[u:].sum() == pytest.approx(p, abs=1e-12)


def test_attained_levels_derived_by_hand():
    # k = 3 seeds: 3 changes, 3 seed pairs; only U = 9 (all changes above all distances) has p = 1/C(6,3).
    assert attained_level(3, 3) == pytest.approx(1 / 20)
    assert min_p(3, 3) == pytest.approx(1 / 20)
    # k = 2: the smallest p is 1/C(3,2) = 1/3 > 0.05, so the rule can never fire.
    assert attained_level(2, 1) == 0.0
    # 3 vs 3 two-sided: smallest p = 2/20 = 0.1.
    assert attained_level(3, 3, two_sided=True) == 0.0
    assert attained_level(3, 3, alpha=0.1, two_sided=True) == pytest.approx(0.1)
    # k = 4: U in {24, 23, 22} (counts 1, 1, 2 of C(10,4) = 210 arrangements) -> 7/210 = 0.0333
    assert attained_level(4, 6) == pytest.approx(7 / 210)


def _null_tables(k: int, n_layers: int, n_heads: int, rng) -> tuple[dict, dict]:
    """Pairwise tables whose base-vs-tuned and seed-vs-seed distances are i.i.d. (the rule's null)."""
    grid = pd.MultiIndex.from_product([range(1, n_layers + 1), range(n_heads)], names=["layer", "head"]).to_frame(
        index=False)
    base = pd.concat([grid.assign(tuned=f"t/s{s}", task="t", seed=s, cosine=1 - rng.random(len(grid)) * 0.5,
                                  js_divergence=rng.random(len(grid)), n_examples=10) for s in range(k)])
    seed = pd.concat([grid.assign(task="t", seed_a=a, seed_b=b, cosine=1 - rng.random(len(grid)) * 0.5,
                                  js_divergence=rng.random(len(grid)), n_examples=10)
                      for a, b in combinations(range(k), 2)])
    return {"attention_change": base}, {"seedpair_attention_change": seed}


@pytest.mark.parametrize("k", [3, 4])
def test_false_positive_rate_matches_the_derived_level(k):
    """Under exchangeable distances the share of heads flagged equals attained_level within 4 binomial SDs."""
    rng = np.random.default_rng(k)
    base, seeds = _null_tables(k, n_layers=50, n_heads=40, rng=rng)
    out = study_tables(base, seeds)
    eff = out["study_effects"]
    heads = eff[(eff["level"] == "head") & (eff["metric"] == "cosine_distance")]
    assert len(heads) == 2000 and heads["beyond_noise"].notna().all()
    rate = heads["beyond_noise"].astype(bool).mean()
    level = attained_level(k, comb(k, 2))
    tol = 4 * sqrt(level * (1 - level) / len(heads))
    assert abs(rate - level) <= tol, (rate, level, tol)
    # the counts table's expectation is the same number
    row = _one(out["study_counts"], metric="cosine_distance", level="head")
    assert row["expected_false"] == pytest.approx(level * 2000)
    rule = _one(out["study_rule"], n_seeds=k)
    assert rule["false_positive_rate"] == pytest.approx(level) and rule["smallest_p"] == pytest.approx(1 / comb(k + comb(k, 2), k))


# --------------------------------------------------------------------------------- planted effects
def test_planted_layer_is_beyond_noise_and_the_rest_is_not(study):
    _, _, out = study
    eff = out["study_effects"]
    for metric in ("cosine_distance", "js_divergence"):
        layers = eff[(eff["table"] == "attention_change") & (eff["level"] == "layer") & (eff["metric"] == metric)]
        sst2 = layers[layers["task"] == "sst2"].set_index("layer")["beyond_noise"]
        assert bool(sst2[5]) and not sst2.drop(5).astype(bool).any()
        assert not layers[layers["task"] == "mrpc"]["beyond_noise"].astype(bool).any()
    rep = eff[(eff["table"] == "representation_similarity") & (eff["task"] == "sst2")
              & (eff["metric"] == "cka_linear")].set_index("layer")["beyond_noise"]
    assert bool(rep[5]) and not rep.drop(5).astype(bool).any()
    assert bool(_one(eff, table="probe", task="sst2", metric="uuas", unit="L5")["beyond_noise"])
    assert bool(_one(eff, table="ablation", task="sst2", metric="accuracy", unit="L5H0")["beyond_noise"])
    assert _one(eff, table="ablation", task="sst2", metric="accuracy", unit="L5H0")["change_mean"] < -0.15


def test_single_seed_has_no_noise_estimate(study):
    _, _, out = study
    eff = out["study_effects"]
    rte = eff[eff["task"] == "rte"]
    assert len(rte) and rte["beyond_noise"].isna().all() and rte["beyond_noise_fdr"].isna().all()
    assert set(rte["reason"]) == {"1 seed: no seed-noise estimate"}
    diff = out["study_task_differences"]
    with_rte = diff[(diff["task_a"] == "rte") | (diff["task_b"] == "rte")]
    assert len(with_rte) and with_rte["beyond_noise"].isna().all()
    assert set(with_rte["reason"]) == {"rte has 1 seed: no seed-noise estimate"}
    counts = out["study_counts"]
    assert (counts.loc[counts["task"] == "rte", "n_tested"] == 0).all()


def test_two_seeds_cannot_reach_alpha_and_say_so(tmp_path):
    base, seeds = read_study_tables(synthetic_study(tmp_path, {"a": 2}, planted={"a": 2}))
    eff = study_tables(base, seeds)["study_effects"]
    assert eff["beyond_noise"].isna().all()
    assert eff["reason"].str.contains("smallest possible p is 0.333").all()


def test_missing_seed_pair_table_is_a_reason_not_a_guess(study):
    base, _, _ = study
    eff = study_tables(base, {})["study_effects"]
    att = eff[(eff["table"] == "attention_change") & (eff["task"] == "sst2")]
    assert att["beyond_noise"].isna().all()
    assert set(att["reason"]) == {"no seed-vs-seed comparison for this unit"}
    # per-model tables need no seed-pair table
    assert eff[(eff["table"] == "ablation") & (eff["task"] == "sst2")]["beyond_noise"].notna().all()


def test_task_difference_with_four_seeds_each(tmp_path):
    folder = synthetic_study(tmp_path, {"a": 4, "b": 4}, planted={"a": 3})
    base, seeds = read_study_tables(folder)
    diff = study_tables(base, seeds)["study_task_differences"]
    att = diff[(diff["table"] == "attention_change") & (diff["metric"] == "cosine_distance")
               & (diff["level"] == "layer")].set_index("layer")
    assert bool(att.loc[3, "beyond_noise"])
    assert att.loc[3, "p_value"] == pytest.approx(2 / comb(8, 4))
    # p-values equal scipy's on the per-seed layer means computed here
    ch = base["attention_change"].assign(c=lambda d: 1 - d["cosine"])
    per_seed = ch[ch["layer"] == 1].groupby(["task", "seed"])["c"].mean()
    p = mannwhitneyu(per_seed["a"], per_seed["b"], alternative="two-sided", method="exact").pvalue
    assert att.loc[1, "p_value"] == pytest.approx(p)
    assert att.loc[1, "difference"] == pytest.approx(per_seed["a"].mean() - per_seed["b"].mean())


# ------------------------------------------------------------------------ summaries, independently
def test_summary_matches_independent_computation(study):
    base, seeds, out = study
    summ = out["study_summary"]
    # attention change, head L2H1 of sst2: 1 - cosine over the three seeds
    att = base["attention_change"]
    vals = 1 - att[(att["task"] == "sst2") & (att["layer"] == 2) & (att["head"] == 1)].sort_values("seed")["cosine"]
    row = _one(summ, table="attention_change", task="sst2", metric="cosine_distance", unit="L2H1", quantity="change")
    assert row["mean"] == pytest.approx(np.mean(vals)) and row["sd"] == pytest.approx(np.std(vals, ddof=1))
    assert row["min"] == pytest.approx(vals.min()) and row["max"] == pytest.approx(vals.max()) and row["n_seeds"] == 3
    # layer level = mean over the layer's heads per seed, then over seeds
    per_seed = 1 - att[(att["task"] == "sst2") & (att["layer"] == 5)].groupby("seed")["cosine"].mean()
    row = _one(summ, table="attention_change", task="sst2", metric="cosine_distance", unit="L5", quantity="change")
    assert row["mean"] == pytest.approx(per_seed.mean()) and row["sd"] == pytest.approx(per_seed.std(ddof=1))
    # representation similarity: 1 - the diagonal
    rep = base["representation_similarity"]
    diag = rep[(rep["task"] == "mrpc") & (rep["layer_base"] == 3) & (rep["layer_tuned"] == 3)
               & (rep["metric"] == "rsa_pearson")]["value"]
    row = _one(summ, table="representation_similarity", task="mrpc", metric="rsa_pearson", unit="L3",
               quantity="change")
    assert row["mean"] == pytest.approx(np.mean(1 - diag)) and row["sd"] == pytest.approx(np.std(1 - diag, ddof=1))
    # patterns: tuned - base fraction
    pat = base["attention_patterns"]
    sel = pat[(pat["task"] == "sst2") & (pat["layer"] == 5) & (pat["head"] == 2) & (pat["pattern"] == "heterogeneous")]
    wide = sel.pivot(index="seed", columns="model", values="fraction")
    row = _one(summ, table="attention_patterns", task="sst2", metric="heterogeneous", unit="L5H2", quantity="change")
    assert row["mean"] == pytest.approx((wide["tuned"] - wide["base"]).mean())
    # ablation: the delta itself
    abl = base["ablation"]
    d = abl[(abl["task"] == "mrpc") & (abl["target"] == "head") & (abl["layer"] == 4) & (abl["head"] == 3)]["delta"]
    row = _one(summ, table="ablation", task="mrpc", metric="accuracy", unit="L4H3", quantity="change")
    assert row["mean"] == pytest.approx(d.mean()) and row["sd"] == pytest.approx(d.std(ddof=1))


def test_seed_noise_matches_independent_computation(study):
    base, seeds, out = study
    noise = out["study_seed_noise"]
    sp = seeds["seedpair_attention_change"]
    d = 1 - sp[(sp["task"] == "mrpc") & (sp["layer"] == 3) & (sp["head"] == 2)]["cosine"]
    row = _one(noise, table="attention_change", task="mrpc", metric="cosine_distance", unit="L3H2")
    assert row["n_seed_pairs"] == 3 and row["max"] == pytest.approx(d.max()) and row["mean"] == pytest.approx(d.mean())
    # per-model tables: |c_a - c_b| over the pairs of seeds
    abl = base["ablation"]
    c = abl[(abl["task"] == "sst2") & (abl["target"] == "head") & (abl["layer"] == 1) & (abl["head"] == 0)]
    c = c.set_index("seed")["delta"]
    pair = [abs(c[a] - c[b]) for a, b in combinations(sorted(c.index), 2)]
    row = _one(noise, table="ablation", task="sst2", metric="accuracy", unit="L1H0")
    assert row["max"] == pytest.approx(max(pair)) and row["mean"] == pytest.approx(np.mean(pair))
    # the verdict's p is scipy's on the magnitudes vs the distances
    eff = _one(out["study_effects"], table="ablation", task="sst2", metric="accuracy", unit="L1H0")
    p = mannwhitneyu(c.abs(), pair, alternative="greater", method="exact").pvalue
    assert eff["p_value"] == pytest.approx(p)


def test_bad_input_is_a_clear_error(study):
    base, seeds, _ = study
    broken = base["attention_change"].drop(columns=["cosine"])
    with pytest.raises(BertologyError, match="lacks column"):
        study_tables({"attention_change": broken}, seeds)
    with pytest.raises(BertologyError, match="alpha"):
        study_tables(base, seeds, alpha=1.5)


def test_seed_pairs_computed_both_ways_count_once(study):
    base, seeds, out = study
    sp = seeds["seedpair_attention_change"]
    both = pd.concat([sp, sp.rename(columns={"seed_a": "seed_b", "seed_b": "seed_a"})], ignore_index=True)
    again = study_tables(base, {"seedpair_attention_change": both,
                                "seedpair_representation_similarity": seeds["seedpair_representation_similarity"]})
    pd.testing.assert_frame_equal(again["study_effects"], out["study_effects"])


def test_missing_or_clashing_seeds_are_errors(study):
    base, seeds, _ = study
    att = base["attention_change"].copy()
    att.loc[att.index[0], "seed"] = None
    with pytest.raises(BertologyError, match="rows without seed"):
        study_tables({"attention_change": att}, seeds)
    att = base["attention_change"].copy()
    att.loc[(att["task"] == "sst2") & (att["seed"] == 1), "seed"] = 0
    with pytest.raises(BertologyError, match="several tuned models"):
        study_tables({"attention_change": att}, seeds)


def test_every_corpus_gets_its_own_tables_named_like_its_inputs(study):
    """corpus_study_tables: own_<table> -> own_study_*, <table>_ood -> study_*_ood, each from its own inputs only."""
    from bertology.studies.noise import corpus_study_tables

    base, seeds, shared = study
    rs = base["representation_similarity"]
    far = rs.assign(value=rs["value"] * 0.5)  # another corpus: every change larger
    tables = {**base, **seeds, "own_representation_similarity": far,
              "own_seedpair_representation_similarity": seeds["seedpair_representation_similarity"],
              "representation_similarity_ood": far}  # no seed pairs out of domain
    out = corpus_study_tables(tables)
    names = ("study_summary", "study_seed_noise", "study_effects", "study_counts")
    assert set(out) == {*shared, *(f"own_{n}" for n in names), *(f"{n}_ood" for n in names),
                        "study_task_differences_ood"}
    for name in shared:  # the shared corpus is untouched by the others
        pd.testing.assert_frame_equal(out[name], shared[name])
    alone = study_tables({"representation_similarity": far},
                         {"seedpair_representation_similarity": seeds["seedpair_representation_similarity"]})
    for name in names:
        pd.testing.assert_frame_equal(out[f"own_{name}"], alone[name])
    ood = out["study_effects_ood"]
    assert set(ood["table"]) == {"representation_similarity"} and (ood["n_seed_pairs"] == 0).all()
    assert ood["beyond_noise"].isna().all() and set(ood["reason"]) <= {"no seed-vs-seed comparison for this unit",
                                                                       "1 seed: no seed-noise estimate"}


def test_ablation_layer_units_keep_their_layer_mode_apart():
    """Skip, all-heads and revert rows of one layer are different ablations: never averaged into one unit."""
    from bertology.studies.noise import judged

    rows = [{"task": "t", "seed": s, "target": "layer", "layer": 2, "head": -1, "mode": "revert", "layer_mode": lm,
             "metric": "accuracy", "delta": d + 0.01 * s, "ci_low": d - 0.1, "ci_high": d + 0.1}
            for s in (1, 2) for lm, d in (("revert_attention", -0.3), ("revert_ffn", 0.0))]
    rows.append({"task": "t", "seed": 1, "target": "layer", "layer": 0, "head": -1, "mode": "revert",
                 "layer_mode": "revert_embeddings", "metric": "accuracy", "delta": -0.5, "ci_low": -0.6, "ci_high": -0.4})
    out = judged()["ablation"].extract(pd.DataFrame(rows), ["task", "seed"])
    by_unit = out[out["seed"] == 1].set_index("unit")["change"]
    assert by_unit["L2 revert_attention"] == pytest.approx(-0.29) and by_unit["L2 revert_ffn"] == pytest.approx(0.01)
    assert by_unit["L0 revert_embeddings"] == pytest.approx(-0.5) and set(out["level"]) == {"layer"}


def _per_seed(seeds, row):
    """One task's rows for each seed: ``row(seed)`` gives that seed's rows."""
    return pd.DataFrame([{"tuned": f"t/s{s}", "task": "t", "seed": s, **r} for s in seeds for r in row(s)])


def test_transplant_gain_is_aggregated_per_unit_and_judged_against_seed_noise():
    """Four seeds: the top layer's transplant recovers ~0.8 of the gain in every seed (beyond noise), the
    embeddings' gain jumps around 0 (not), and a seed whose gain is undefined leaves that seed out."""
    def rows(s):
        out = [{"unit_kind": "layer", "layer": 2, "head": -1, "label": "L2", "metric": "accuracy",
                "gain_recovered": 0.8 + 0.01 * s},
               {"unit_kind": "embeddings", "layer": 0, "head": -1, "label": "embeddings", "metric": "accuracy",
                "gain_recovered": (-0.3, 0.2, -0.1, 0.3)[s - 1]},
               {"unit_kind": "layers", "layer": -1, "head": -1, "label": "top 1 layers", "metric": "accuracy",
                "gain_recovered": np.nan if s == 4 else 0.7}]
        return out
    tables = study_tables({"transplant": _per_seed((1, 2, 3, 4), rows)}, {})
    effects = tables["study_effects"].set_index("unit")
    assert set(effects["table"]) == {"transplant"}
    assert effects.loc["L2", "level"] == "layer" and effects.loc["top 1 layers", "level"] == "layers"
    assert bool(effects.loc["L2", "beyond_noise"]) and not bool(effects.loc["embeddings", "beyond_noise"])
    assert int(effects.loc["top 1 layers", "n_seeds"]) == 3  # seed 4's undefined gain is left out
    assert effects.loc["L2", "change_mean"] == pytest.approx(np.mean([0.81, 0.82, 0.83, 0.84]))


def test_changed_vs_needed_rho_is_one_unit_per_level_and_measure():
    def rows(s):
        return [{"level": lv, "change_measure": cm, "needed_measure": "revert_drop", "metric": "loss",
                 "spearman": rho + 0.01 * s, "ci_low": np.nan, "ci_high": np.nan}
                for lv, cm, rho in (("head", "weight", 0.6), ("layer", "attention_js", 0.1))]
    tables = study_tables({"changed_vs_needed": _per_seed((1, 2, 3), rows)}, {})
    effects = tables["study_effects"].set_index("unit")
    assert set(effects.index) == {"heads: weight", "layers: attention_js"} and set(effects["level"]) == {"model"}
    assert effects.loc["heads: weight", "change_mean"] == pytest.approx(0.62)
    assert bool(effects.loc["heads: weight", "beyond_noise"])  # 0.61-0.63 in every seed, seeds 0.01-0.02 apart


def test_the_study_report_lists_rho_and_transplant_curves_per_task_with_verdicts():
    from bertology.report.study import _which_change

    def transplant(s):
        return [{"unit_kind": "layers", "layer": -1, "head": -1, "label": "top 1 layers", "metric": "accuracy",
                 "gain_recovered": 0.7 + 0.01 * s},
                {"unit_kind": "layer", "layer": 2, "head": -1, "label": "L2", "metric": "accuracy", "gain_recovered": 0.5}]

    def rho(s):
        return [{"level": "head", "change_measure": "weight", "needed_measure": "revert_drop", "metric": "loss",
                 "spearman": (0.3, -0.2, 0.1)[s - 1], "ci_low": np.nan, "ci_high": np.nan}]
    tables = study_tables({"transplant": _per_seed((1, 2, 3), transplant), "changed_vs_needed": _per_seed((1, 2, 3), rho)}, {})
    body = _which_change(tables)
    rows = [[c["text"] if isinstance(c, dict) else c for c in r] for r in body["table"]["rows"]]
    assert [(r[1], r[2], r[-1]) for r in rows] == [("Spearman, change vs revert drop", "heads: weight", "within noise"),
                                                  ("gain recovered", "top 1 layers", "beyond noise")]
    assert _which_change({"study_effects": pd.DataFrame()}) is None


def test_each_attention_measure_gets_its_own_verdicts():
    """A table of several attention measures: the weights rows are judged as they are alone, each other measure's
    rows as their own units (``norm/vertical``), and a per-layer measure's one map per layer (head -1) as a layer."""
    tuned = {"weights": (0.5, 0.01), "norm": (0.8, 0.001), "rollout": (0.6, 0.001)}  # tuned = a + b * seed

    def rows(s):
        out = []
        for measure, (a, b) in tuned.items():
            for head in ((-1,) if measure == "rollout" else (0, 1)):
                for model, value in (("base", 0.5 if measure != "rollout" else 0.4), ("tuned", a + b * s)):
                    out.append({"measure": measure, "model": model, "layer": 1, "head": head, "pattern": "vertical",
                                "fraction": value})
        return out
    mixed = _per_seed((1, 2, 3), rows)
    effects = study_tables({"attention_patterns": mixed}, {})["study_effects"]
    alone = study_tables({"attention_patterns": mixed[mixed["measure"] == "weights"].drop(columns="measure")},
                         {})["study_effects"]
    weights = effects[~effects["metric"].str.contains("/")].reset_index(drop=True)
    pd.testing.assert_frame_equal(weights, alone, check_exact=True)
    assert set(effects["metric"]) == {"vertical", "norm/vertical", "rollout/vertical"}
    norm = effects[effects["metric"] == "norm/vertical"].set_index("unit")
    assert set(norm.index) == {"L1H0", "L1H1", "all"}
    assert norm.loc["L1H0", "change_mean"] == pytest.approx(0.302)  # 0.801..0.803 - 0.5
    assert bool(norm.loc["L1H0", "beyond_noise"])  # every |c| ~0.3 above every seed distance (<= 0.002): p = 1/20
    assert not bool(_one(effects, metric="vertical", unit="L1H0")["beyond_noise"])  # 0.01-0.03 vs 0.01-0.02
    rollout = effects[effects["metric"] == "rollout/vertical"].set_index("unit")
    assert set(rollout.index) == {"L1", "all"} and rollout.loc["L1", "level"] == "layer"
    assert pd.isna(rollout.loc["L1", "head"]) and not effects["unit"].str.contains("H-1").any()
    assert rollout.loc["L1", "change_mean"] == pytest.approx(0.202)


def test_a_per_layer_measure_of_a_pairwise_table_is_one_unit_per_layer():
    """attention_change under rollout (one map per layer, head -1): one ``L1`` unit per metric, the layer's value."""
    from bertology.studies.changes import by_measure, judged

    rows = [{"task": "t", "seed": 1, "measure": m, "layer": 1, "head": h, "cosine": c, "js_divergence": 0.1}
            for m, h, c in (("weights", 0, 0.9), ("weights", 1, 0.7), ("rollout", -1, 0.6))]
    out = by_measure(judged()["attention_change"], pd.DataFrame(rows), ["task", "seed"])
    rollout = out[out["metric"].str.startswith("rollout/")].set_index(["metric", "unit"])
    assert sorted(rollout.index) == [("rollout/cosine_distance", "L1"), ("rollout/js_divergence", "L1")]
    assert rollout.loc[("rollout/cosine_distance", "L1"), "change"] == pytest.approx(0.4)
    weights = out[~out["metric"].str.contains("/")].set_index(["metric", "unit"])
    assert weights.loc[("cosine_distance", "L1"), "change"] == pytest.approx(0.2)  # mean of 0.1 and 0.3
    assert len(weights) == 6  # 2 heads + the layer, 2 metrics
