"""The across-seeds rule for crosscoder latents, on synthetic decoder directions (no model)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bertology.metrics.crosscoder_seeds import best_match_cosines, null_threshold, random_directions, recurrence
from bertology.studies.crosscoder_seeds import seed_feature_table, task_features, verdict_counts

DIM, N, ALPHA = 64, 40, 0.05


def _directions(by_seed: dict[int, np.ndarray], task: str = "t", layer: int = 2) -> pd.DataFrame:
    frames = []
    for seed, dirs in by_seed.items():
        df = pd.DataFrame(dirs, columns=[f"d{i}" for i in range(dirs.shape[1])])
        df.insert(0, "latent", np.arange(len(dirs)))
        df.insert(0, "layer", layer)
        df.insert(0, "seed", seed)
        df.insert(0, "task", task)
        df.insert(0, "tuned", f"{task}/s{seed}")
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def test_best_match_is_the_largest_signed_cosine():
    a = np.array([[1.0, 0.0], [0.0, 2.0]])
    b = np.array([[-1.0, 0.0], [1.0, 1.0]])
    # row 0: cosines -1 and 1/sqrt2; row 1: 0 and 1/sqrt2 (the sign counts: -u is another feature)
    assert best_match_cosines(a, b) == pytest.approx([2 ** -0.5, 2 ** -0.5], abs=1e-12)


def test_null_threshold_is_the_quantile_of_random_best_matches():
    """Independent check: an empirical quantile from a fresh rng lands near it (2000 draws: the 0.95 quantile's
    standard error is sqrt(.05 * .95 / 2000) ~ 0.005 in probability, a few thousandths in cosine)."""
    thr = null_threshold(N, DIM, alpha=ALPHA, draws=2000, seed=0)
    rng = np.random.default_rng(123)
    best = best_match_cosines(random_directions(4000, DIM, rng), random_directions(N, DIM, rng))
    assert 0.0 < thr < 1.0
    assert np.mean(best >= thr) == pytest.approx(ALPHA, abs=0.02)


def test_random_dictionaries_call_about_alpha_or_fewer_task_features():
    """Three seeds of random directions: a latent needs both other seeds, so at most ~alpha**2 are called;
    with m=1 (either seed) at most ~1-(1-alpha)**2 ~ 0.0975. Bounds: those rates plus 3 binomial sds on 120 latents."""
    rng = np.random.default_rng(7)
    dirs = _directions({s: random_directions(N, DIM, rng) for s in (1, 2, 3)})
    strict = task_features(seed_feature_table(dirs, alpha=ALPHA))
    assert len(strict) == 3 * N
    assert strict["task_feature"].mean() <= ALPHA
    loose = task_features(seed_feature_table(dirs, m=1, alpha=ALPHA))
    rate = 1 - (1 - ALPHA) ** 2
    assert loose["task_feature"].mean() <= rate + 3 * np.sqrt(rate * (1 - rate) / (3 * N))


def test_a_planted_shared_direction_is_called_in_every_seed():
    rng = np.random.default_rng(11)
    shared = random_directions(1, DIM, rng)[0]
    by_seed = {}
    for s in (1, 2, 3):
        dirs = random_directions(N, DIM, rng)
        dirs[5] = shared + 0.05 * rng.standard_normal(DIM)  # the same feature, a little noise per seed
        by_seed[s] = dirs
    table = seed_feature_table(_directions(by_seed), alpha=ALPHA)
    per = task_features(table).set_index(["seed", "latent"])
    for s in (1, 2, 3):
        assert per.loc[(s, 5), "task_feature"]
        assert per.loc[(s, 5), "recurs_in"] == 2
    assert per["task_feature"].sum() <= 3 + 1  # the planted one per seed, at most a stray random one
    counts = verdict_counts(table)
    assert counts.loc[0, "n_tuned_only"] == 3 * N
    assert counts.loc[0, "n_task_features"] >= 3


def test_recurrence_counts_other_seeds_only():
    rng = np.random.default_rng(3)
    d = random_directions(5, DIM, rng)
    res = recurrence({1: d, 2: d.copy()}, draws=200)
    assert set(res[1]["best"]) == {2}
    assert (res[1]["recurs_in"] == 1).all()  # identical dictionaries: every latent recurs in the one other seed


def test_one_seed_gives_no_rows():
    rng = np.random.default_rng(5)
    assert seed_feature_table(_directions({1: random_directions(4, DIM, rng)})).empty


def test_the_rule_on_random_dictionaries_calls_about_alpha():
    """The null rule end to end: 20 studies of two seeds of random dictionaries (m = 1: one comparison per latent),
    1600 latents judged; the share called is alpha = 5 % up to the binomial spread (sd ~0.0054) and the threshold's
    own sampling error (2000 draws: ~0.005 in probability), so within 0.02 either way: neither lax nor timid."""
    rng = np.random.default_rng(21)
    called = []
    for _ in range(20):
        dirs = _directions({s: random_directions(N, DIM, rng) for s in (1, 2)})
        called.append(task_features(seed_feature_table(dirs, alpha=ALPHA))["task_feature"].to_numpy())
    rate = np.concatenate(called).mean()
    assert rate == pytest.approx(ALPHA, abs=0.02)


def test_a_seed_without_tuned_only_latents_still_counts():
    """Seeds 1 and 2 share a direction, seed 3's crosscoder found no tuned-only latent: told by the fit table that
    seed 3 ran, the rule needs all of the other seeds (2) and calls nothing; not told, it judges two seeds only."""
    rng = np.random.default_rng(13)
    shared = random_directions(1, DIM, rng)
    dirs = _directions({1: shared.copy(), 2: shared.copy()})
    fit = pd.DataFrame({"tuned": ["t/s1", "t/s2", "t/s3"], "task": "t", "seed": [1, 2, 3], "layer": 2})
    told = task_features(seed_feature_table(dirs, fit=fit))
    assert (told["needed"] == 2).all() and (told["recurs_in"] == 1).all() and not told["task_feature"].any()
    untold = task_features(seed_feature_table(dirs))
    assert (untold["needed"] == 1).all() and untold["task_feature"].all()
    rows = seed_feature_table(dirs, fit=fit)
    assert set(rows["other_seed"]) == {1, 2, 3} and not rows[rows["other_seed"] == 3]["recurs"].any()


def test_the_study_report_rows_put_task_features_first_with_their_matches():
    from bertology.report.study_crosscoder import counts, latent_rows

    rng = np.random.default_rng(17)
    shared = random_directions(1, DIM, rng)[0]
    by_seed = {s: random_directions(3, DIM, rng) for s in (1, 2, 3)}
    for s in by_seed:
        by_seed[s][2] = shared
    table = seed_feature_table(_directions(by_seed), alpha=ALPHA)
    examples = pd.DataFrame({"task": "t", "layer": 2, "seed": [1, 1, 2], "latent": [2, 2, 2],
                             "token": ["cat", "cat", "dog"]})
    rows = latent_rows(table, examples)
    assert len(rows) == 9 and [r[4] for r in rows[:3]] == ["task feature"] * 3
    assert [r[2] for r in rows[:3]] == [1, 2, 3] and all(r[3] == 2 for r in rows[:3])
    assert rows[0][5] == "2 of 2: s2, s3 (needed 2)" and rows[0][6] == "s2: 1.00 ✓; s3: 1.00 ✓"
    assert rows[0][8] == "cat" and rows[1][8] == "dog" and rows[2][8] == "—"
    assert rows[0][7] == pytest.approx(table["null_threshold"].max())
    assert counts(table) == [{"task": "t", "layer": 2, "seeds": 3, "judged": 9,
                              "features": int(task_features(table)["task_feature"].sum())}]
