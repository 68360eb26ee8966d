"""A picked extreme reads in the decimals that tell it from the runner-up, or as "all equal" when nothing does:
the helpers, and the summary lines (command line, notebook card) that name the most changed heads."""
import pandas as pd

from bertology.analyses.attention_change import summary as attention_summary
from bertology.analyses.head_map import summary as head_map_summary
from bertology.analyses.relation_heads import summary as relation_summary
from bertology.extremes import (all_read_the_same, bound_text, decimals_to_tell, picks_text, significant_to_tell,
                                ties)


def test_the_decimals_grow_until_each_pick_reads_apart_from_the_next():
    assert decimals_to_tell([0.841, 0.942, 0.947], 2) == 3  # already apart at 3
    assert decimals_to_tell([0.8410, 0.8412, 0.9], 1) == 4
    assert decimals_to_tell([0.99961, 0.99972, 0.5], 1) == 4
    assert decimals_to_tell([0.99961, 0.99962, 0.99990], 2) == 5  # the second pick against the third: 4 is enough
    assert decimals_to_tell([0.5, 0.5, 0.4], 1) == 3 and ties([0.5, 0.5, 0.4]) == 1  # a real tie is a tie
    assert significant_to_tell([6.531, 6.534, 1.0], 1) == 4 and significant_to_tell([0.0148, 0.0143], 1) == 3


def test_values_that_all_read_the_same_say_so_with_their_bound():
    near_one = [0.99961, 0.99972, 0.99985, 0.99999]
    assert all_read_the_same(near_one) and not all_read_the_same([0.9981, 0.99999])
    assert bound_text(near_one, lowest=True) == "≥ 0.9995"
    assert bound_text([0.0001, 0.0004], lowest=False) == "≤ 0.0005"
    assert bound_text([1.0, 1.0], lowest=True) == "= 1.000"
    assert picks_text(["L1H0", "L1H1", "L2H0", "L2H1"], near_one, 3, lowest=True) == "all 4 heads ≥ 0.9995"
    assert picks_text(["a", "b", "c"], [0.8410, 0.8412, 0.95], 2, lowest=True) == "a (0.8410), b (0.8412)"


def _attention(cosines: list[float], js: list[float]) -> dict:
    rows = [dict(layer=1 + i // 4, head=i % 4, cosine=c, js_divergence=j, n_examples=10)
            for i, (c, j) in enumerate(zip(cosines, js))]
    return {"attention_change": pd.DataFrame(rows)}


def test_the_attention_summary_never_ranks_heads_by_digits_it_does_not_show():
    # every cosine rounds to 1.000 and every JS to 0.000 at three decimals: the old line read "L2H1 (1.000), ..."
    cos = [0.99990, 0.99985, 0.99999, 0.99993, 0.99962, 0.99991, 0.99998, 0.99997]
    js = [0.00001, 0.00002, 0.0, 0.00001, 0.00030, 0.00001, 0.0, 0.0]
    line = attention_summary(_attention(cos, js))
    assert "lowest cosine all 8 heads ≥ 0.9995" in line and "highest JS divergence all 8 heads ≤ 0.0005" in line
    assert "(1.000)" not in line
    # distinct at 3 decimals except for the runner-up pair: those get a fourth
    cos = [0.95, 0.8410, 0.8412, 0.99, 0.97, 0.96, 0.98, 0.999]
    js = [0.01, 0.2, 0.19, 0.001, 0.005, 0.004, 0.002, 0.0]
    line = attention_summary(_attention(cos, js))
    assert "lowest cosine L1H1 (0.8410), L1H2 (0.8412), L1H0 (0.9500)" in line
    assert "highest JS divergence L1H1 (0.200), L1H2 (0.190), L1H0 (0.010)" in line


def test_the_head_map_and_relation_summaries_tell_their_picks_apart():
    hm = pd.DataFrame([dict(model="base", layer=1, head=h, moved=m) for h, m in enumerate([0.4721, 0.4724, 0.1, 0.0])])
    assert head_map_summary({"head_map": hm}) == "head map: heads that moved most (JS distance) L1H1 (0.4724), " \
                                                 "L1H0 (0.4721), L1H2 (0.1000)"
    rows = [dict(model=m, relation="all", direction=d, layer=1, head=h, accuracy=a, baseline_offset=-1,
                 baseline_accuracy=0.2, n=100)
            for m in ("base", "tuned") for d in ("dep->head", "head->dep") for h, a in enumerate([0.30, 0.30, 0.1])]
    line = relation_summary({"relation_heads": pd.DataFrame(rows)})
    assert "base 0.300 (L1H0, tied with 1 more; best offset 0.200)" in line
