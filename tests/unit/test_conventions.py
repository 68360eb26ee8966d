"""Paper conventions: presets resolve once, an explicit setting wins, the manifest records each
choice and its source, and Clark et al.'s punctuation rule is pinned against a direct computation."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bertology.analyses.attention_targets import AttentionTargets, PunctuationLookup, TargetConventions, is_punct_token
from bertology.activations.extract import run_analyses
from bertology.config import CompareConfig
from bertology.conventions import CONVENTIONS, PRESETS, describe, resolve
from bertology.data.corpus import Corpus
from bertology.data.encode import encode_corpus
from bertology.errors import BertologyError
from bertology.models.pair import ModelPair


def test_presets_fill_only_what_the_user_left_open():
    assert (resolve(CompareConfig()).attention_mode, resolve(CompareConfig()).punctuation) == ("cropped", "unicode")
    clark = resolve(CompareConfig(conventions="clark2019"))
    assert (clark.attention_mode, clark.punctuation) == ("cropped", "clark2019")
    assert resolve(CompareConfig(conventions="kovaleva2019")).attention_mode == "padded"
    mixed = resolve(CompareConfig(conventions="clark2019", punctuation="unicode", attention_mode="padded"))
    assert (mixed.attention_mode, mixed.punctuation) == ("padded", "unicode")  # the explicit settings win
    assert resolve(resolve(CompareConfig(conventions="clark2019"))) == clark  # resolving twice changes nothing


def test_bad_names_are_one_clear_error():
    with pytest.raises(BertologyError, match="Unknown conventions preset 'clark' \\(did you mean clark2019\\?\\); choose from: bertology, clark2019"):
        resolve(CompareConfig(conventions="clark"))
    with pytest.raises(BertologyError, match="Unknown attention_mode 'full'; choose from: cropped, padded"):
        resolve(CompareConfig(attention_mode="full"))  # type: ignore[arg-type]


def test_every_preset_names_known_conventions_and_the_manifest_says_where_each_comes_from():
    fields = {c.field: c for c in CONVENTIONS}
    for preset, settings in PRESETS.items():
        assert all(f in fields and v in fields[f].choices for f, v in settings.items()), preset
    record = describe(resolve(CompareConfig(conventions="kovaleva2019")))
    assert record["preset"] == "kovaleva2019"
    assert record["attention_mode"]["value"] == "padded" and "Kovaleva" in record["attention_mode"]["source"]
    assert record["punctuation"] == {"value": "unicode", "source": CONVENTIONS[1].choices["unicode"],
                                     "tables": ["attention_targets"]}  # which table the choice changes


@pytest.mark.parametrize("token,unicode_rule,clark_rule", [
    (".", True, True), (",", True, True), ("##,", True, True), ("!", True, False), ("?", True, False),
    ("...", True, False), ("'", True, False), ("a", False, False), ("\u0120.", True, True),
])
def test_clark_counts_only_full_stops_and_commas(token, unicode_rule, clark_rule):
    assert is_punct_token(token) is unicode_rule
    assert is_punct_token(token, "clark2019") is clark_rule


def test_clark_punctuation_share_equals_a_direct_computation(identical_pair):
    """``punct`` under clark2019 = mean over real queries of the attention to '.' and ',' keys, per example."""
    pair = ModelPair.load(*map(str, identical_pair))
    corpus = Corpus.from_list(["the cat sat , and the dog ran !", "a dull film .", "we love this movie"])
    enc = encode_corpus(corpus, pair.tokenizer)
    analysis = AttentionTargets(corpus, pair.tokenizer, pair.num_layers, pair.num_heads, word_level=False,
                                conventions=TargetConventions(punctuation="clark2019"))
    run_analyses(pair, enc, [analysis], batch_size=2)
    table = analysis.compute().table
    punct = table[(table.target == "punct") & (table.model == "base")].sort_values(["layer", "head"])
    lookup = PunctuationLookup(pair.tokenizer, "clark2019")
    shares = []
    for it in enc.items:
        keys = lookup(it.input_ids) & ~it.special
        if not keys.any():
            continue  # the value averages over the examples where the target occurs
        with torch.inference_mode():
            out = pair.base.model(input_ids=torch.from_numpy(it.input_ids[None]),
                                  token_type_ids=torch.from_numpy(it.token_type_ids[None]), output_attentions=True)
        maps = torch.stack(out.attentions)[:, 0].double().numpy()  # [L, H, T, T]
        shares.append(maps[..., keys].sum(-1).mean(-1))  # sum over the keys, mean over the queries
    assert len(shares) == 2  # the "!" sentence counts, "we love this movie" has no '.' or ','
    expected = np.mean(shares, axis=0).reshape(-1)
    np.testing.assert_allclose(punct["value"].to_numpy(), expected, rtol=1e-5, atol=1e-6)
    assert set(punct["n"]) == {2}
    assert analysis.params()["punctuation"] == "clark2019"
