"""A compare config's fingerprint is the run's identity: only a completed config has one (the specs' defaults filled
in and their speed settings known as such), and a setting declared not to change the numbers leaves it alone."""
from __future__ import annotations

import pytest

from bertology.errors import BertologyError
from bertology.commands.selection import complete_config, make_config


def test_only_a_completed_config_has_a_fingerprint():
    bare = make_config("d.txt", tuned="t", ablation_units_per_forward=4)
    with pytest.raises(BertologyError, match=r"needs a completed config: bertology.commands.selection.complete_config"):
        bare.fingerprint()
    assert complete_config(bare).fingerprint() == complete_config(make_config("d.txt", tuned="t")).fingerprint()


@pytest.mark.parametrize("speed", [{"ablation_units_per_forward": 8}, {"store": "/tmp/states"}])
def test_speed_settings_leave_the_fingerprint_alone(speed):
    plain = complete_config(make_config("d.txt", tuned="t")).fingerprint()
    assert complete_config(make_config("d.txt", tuned="t", **speed)).fingerprint() == plain
    assert complete_config(make_config("d.txt", tuned="t", rsa_tokens=300)).fingerprint() != plain  # a number setting
