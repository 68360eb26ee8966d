"""A ``zero_is_none`` setting accepts 0 (its help says what 0 means: "0 = all", "0 or not given: auto"), so its
minimum refusal names 0 beside the minimum instead of reading as if 0 were refused too."""
from __future__ import annotations

import pytest

from bertology.errors import BertologyError
from bertology.settings import Setting


@pytest.mark.parametrize(("help_text", "means"), [
    ("Use at most this many (0 = all).", "all"),
    ("Rank of the probe matrix (0 = full rank, the hidden size); the paper's probes saturate at 64-128.", "full rank"),
    ("Track every N steps (CKA/RSA per layer; 0 = off). The weights are the same.", "off"),
    ("Units per forward. 0 or not given: auto, 1 on the CPU.", "auto"),
    ("A count that does not say.", "none"),
])
def test_what_zero_means_is_read_from_the_help(help_text, means):
    s = Setting("n", 0, help_text, minimum=1, zero_is_none=True)
    assert s.zero_means == means
    assert s.check(0) is None and s.check(3) == 3
    with pytest.raises(BertologyError, match=rf"^--n \(n\) must be at least 1, or 0 for {means}, not -1\.$"):
        s.check(-1)


def test_a_setting_without_zero_is_none_or_with_a_minimum_of_zero_is_refused_as_before():
    with pytest.raises(BertologyError, match=r"^--n \(n\) must be at least 1, not 0\.$"):
        Setting("n", 5, "A count (0 = all).", minimum=1).check(0)
    with pytest.raises(BertologyError, match=r"^--n \(n\) must be at least 0, not -1\.$"):
        Setting("n", 0, "A count (0 = all).", minimum=0, zero_is_none=True).check(-1)


def test_the_declared_settings_say_it():
    """compare's speed setting (Python and the command line share the check) and finetune's sample size (its own
    check: 1 example is too few to split)."""
    from bertology.config import DataConfig, FinetuneConfig
    from bertology.commands.selection import complete_config, make_config

    with pytest.raises(BertologyError, match=r"^--ablation-units-per-forward \(ablation_units_per_forward\) must be "
                                             r"at least 1, or 0 for auto, not -2\.$"):
        complete_config(make_config(ablation_units_per_forward=-2))
    with pytest.raises(BertologyError, match=r"^--max-examples \(max_examples\) must be at least 2, or 0 for all, "
                                             r"not 1\.$"):
        FinetuneConfig(model="m", data=DataConfig("d.txt", max_examples=1), out="o")
