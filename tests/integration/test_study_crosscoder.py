"""A study with the crosscoder: a tuned-only direction every seed's model carries is called a task feature by the
seed matching (it recurs in the other seeds beyond the random-dictionary null); per-seed unrelated directions and
tuned models equal to the base are called none.

Tiny random models, no training: each "fine-tune" is a copy of the tiny base whose input embeddings of the PLANTED
words get a direction added (norm 0.4, about four times an embedding row's, as the crosscoder's own planted test),
plus seed-specific noise on every embedding row (so no two seeds' models are the same). k = 2: with k = 4 the
planted latent's relative norm sat at ~0.6, at the tuned-only threshold, and one seed in three missed it."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import bertology as bt
from bertology.testing import TINY_WORDS, save_tiny_bert, tiny_tokenizer, tiny_vocab

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # ~60 s: 18 crosscoders (pairs and seed pairs)

PLANTED = ("cat", "dog", "book", "house", "movie", "film", "man", "girl", "boy", "woman", "actor", "story", "plot",
           "day", "night", "mat")
SEEDS = (0, 1, 2)
HIDDEN = 32
CROSSCODER = {"analyses": ["crosscoder"], "crosscoder_layers": "2", "crosscoder_latents": 32, "crosscoder_k": 2,
              "crosscoder_tokens": 3000, "crosscoder_steps": 400, "crosscoder_batch": 128,
              "crosscoder_buffer": 8192, "crosscoder_examples": 4, "report": False}


def _unit(seed: int) -> torch.Tensor:
    v = torch.randn(HIDDEN, generator=torch.Generator().manual_seed(seed))
    return v / v.norm()


def _planted_copy(base, folder, direction: torch.Tensor | None, noise_seed: int):
    """A copy of ``base``: ``0.4 * direction`` added to the PLANTED words' embeddings (none when ``direction`` is
    None), and every embedding row moved by seed noise (norm ~0.01 per row, a tenth of a row's own norm)."""
    from transformers import BertModel

    model = BertModel.from_pretrained(base, attn_implementation="eager")
    emb = model.embeddings.word_embeddings.weight
    vocab = tiny_vocab()
    with torch.no_grad():
        noise = torch.randn(emb.shape, generator=torch.Generator().manual_seed(1000 + noise_seed))
        emb += 0.01 * noise / np.sqrt(emb.shape[1])
        if direction is not None:
            emb[[vocab[w] for w in PLANTED]] += 0.4 * direction
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """One study, three tasks of three seeds each: ``planted`` (one direction, a little seed noise on it),
    ``unrelated`` (a different random direction per seed) and ``same`` (the base itself, seed noise only)."""
    root = tmp_path_factory.mktemp("study-crosscoder")
    base = save_tiny_bert(root / "base", seed=0)
    shared = _unit(5)
    models = {"planted": {}, "unrelated": {}, "same": {}}
    for s in SEEDS:
        jitter = 0.1 * _unit(50 + s)  # seed-specific noise on the planted direction itself
        models["planted"][s] = _planted_copy(base, root / f"planted{s}", (shared + jitter) / (shared + jitter).norm(), s)
        models["unrelated"][s] = _planted_copy(base, root / f"unrelated{s}", _unit(100 + s), s)
        models["same"][s] = str(base)
    rng = np.random.default_rng(0)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(list(TINY_WORDS), size=rng.integers(5, 12)))
                                for _ in range(300)) + "\n", encoding="utf-8")
    spec = {"base": str(base), "out": str(root / "out"),
            "task": [{"name": name, "models": m} for name, m in models.items()],
            "compare": {"data": str(corpus), "max_examples": 300, "max_length": 16, **CROSSCODER}}
    return bt.study(spec)


def _per_latent(result, task: str) -> pd.DataFrame:
    from bertology.studies.crosscoder_seeds import task_features

    table = result.tables["study_crosscoder_seed_features"]
    return task_features(table[table["task"] == task])


def test_every_job_finished_and_each_seed_has_its_directions(study):
    assert all(j["status"] == "done" for j in study.manifest["jobs"]), study.manifest["jobs"]
    directions = study.tables["crosscoder_directions"]
    planted = directions[directions["task"] == "planted"]
    assert set(planted["seed"]) == set(SEEDS)  # every planted seed found at least one tuned-only latent


def test_the_shared_planted_direction_is_a_task_feature_in_every_seed(study):
    per = _per_latent(study, "planted")
    called = per[per["task_feature"]]
    assert set(called["seed"]) == set(SEEDS)
    assert (called["recurs_in"] == len(SEEDS) - 1).all() and (called["needed"] == len(SEEDS) - 1).all()
    table = study.tables["study_crosscoder_seed_features"]
    rows = table[(table["task"] == "planted") & table["task_feature"]]
    assert (rows["best_match_cosine"] >= rows["null_threshold"]).all()
    assert rows["best_match_cosine"].min() > 0.9  # the same direction up to the 0.1 jitter, far beyond the null
    # the crosscoder's own evidence: a called latent's top contexts are the planted words
    examples = study.tables["crosscoder_examples"]
    for _, row in called.iterrows():
        mine = examples[(examples["task"] == "planted") & (examples["seed"] == row["seed"])
                        & (examples["latent"] == row["latent"])]
        assert len(mine) and mine["token"].isin(PLANTED).mean() >= 0.75, mine["token"].tolist()


def test_unrelated_directions_per_seed_are_called_none(study):
    per = _per_latent(study, "unrelated")
    assert len(per) >= 2  # seeds found their own tuned-only latents (the planted words' own direction): judged
    assert not per["task_feature"].any(), per


def test_the_base_against_itself_is_called_none(study):
    latents = study.tables["crosscoder_latents"]
    same = latents[latents["task"] == "same"]
    assert not same["tuned_only_verified"].fillna(False).any()
    per = _per_latent(study, "same")
    assert per.empty or not per["task_feature"].any()


def test_the_study_report_lists_the_task_features_with_their_seeds_and_cosines(study):
    """The study's own report has the section: the planted latent of each seed called a task feature, recurring in
    both other seeds, its cosines above the null threshold printed; the unrelated ones seed-specific."""
    import re

    html = study.report.read_text(encoding="utf-8")
    assert 'id="crosscoder-seeds"' in html and 'href="#crosscoder-seeds"' in html
    section = html[html.index('id="crosscoder-seeds"'):html.index('id="jobs"')]
    assert "null threshold" in section and "planted</strong>, layer 2: 3 task features" in section
    rows = re.findall(r"<tr>(.*?)</tr>", section, flags=re.S)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", r, flags=re.S) for r in rows]
    planted = [c for c in cells if c and c[0] == "planted"]
    assert len(planted) == 3 and all(c[4] == "task feature" and c[5].startswith("2 of 2") for c in planted)
    assert all(c[0] == "unrelated" and c[4] == "seed-specific" for c in cells if c and c[0] != "planted")
