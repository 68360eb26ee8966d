"""Paper conventions, named and switchable: where bertology and a paper's own code count differently.

Each :class:`Convention` is one setting of :class:`~bertology.config.CompareConfig` with the choices
it takes and the paper each choice reproduces. A preset (``--conventions clark2019``) sets several
at once; a setting the user gives explicitly wins over the preset. :func:`resolve` fills the
settings left open (``None``) from the preset, once, at the start of ``compare``;
:func:`describe` is what the manifest records, so every table can be traced to its conventions.

Only conventions that reproduce the paper's number are offered here. Others the papers differ in
(Kovaleva's word categories, Hewitt's punctuation list) are listed in the README as not yet switchable.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from bertology.config import CompareConfig
from bertology.errors import BertologyError


@dataclass(frozen=True)
class Convention:
    """One switchable convention: the config field, what it decides, and each choice with its source."""

    field: str
    what: str
    choices: Mapping[str, str]
    default: str


CONVENTIONS: tuple[Convention, ...] = (
    Convention(
        "attention_mode", "how two attention maps are flattened for their cosine (attention_change)",
        {"cropped": "the real tokens' maps only (bertology)",
         "padded": "every example padded to pad_length and the whole map flattened (Kovaleva et al. 2019, their notebook)"},
        "cropped",
    ),
    Convention(
        "punctuation", "which tokens count as punctuation (attention_targets)",
        {"unicode": "every token made only of Unicode punctuation (bertology)",
         "clark2019": "the tokens '.' and ',' only (Clark et al. 2019, their released code)"},
        "unicode",
    ),
    Convention(
        "relation_word_attention", "how word pieces' attention becomes word-level attention (relation_heads)",
        {"mean": "to a word = sum over its pieces, from a word = mean over its pieces (Clark et al. 2019, the paper)",
         "clark2019": "maps rounded to float16; to a word = float16 sum over its pieces, from a word = its first "
                      "piece; the word itself a candidate of value 0 (Clark et al. 2019, their released code)"},
        "mean",
    ),
    Convention(
        "entropy_smoothing", "how each attention row's entropy is taken (attention_targets)",
        {"none": "-sum p ln p over the real keys, 0 ln 0 = 0 (bertology)",
         "clark2019": "of 0.9999 p + 0.0001 / n over the n real keys, in nats (Clark et al. 2019, their notebook)"},
        "none",
    ),
    Convention(
        "head_map_distance", "the distance between heads the head map embeds (head_map)",
        {"js_distance": "square root of the mean JS divergence (bits) over query tokens; MDS from a classical start "
                        "(bertology)",
         "js_divergence": "the mean JS divergence (bits) over query tokens; MDS from a classical start",
         "clark2019": "JS divergence (nats) of maps smoothed as 0.999 p + 0.001 / n, summed over query tokens; "
                      "MDS from 5 seeded random starts, 1000 iterations, eps 1e-10 (Clark et al. 2019, their code)"},
        "js_distance",
    ),
)

#: Preset -> the conventions it sets (the others keep bertology's).
PRESETS: Mapping[str, Mapping[str, str]] = {
    "bertology": {},
    "clark2019": {"punctuation": "clark2019", "relation_word_attention": "clark2019", "entropy_smoothing": "clark2019",
                  "head_map_distance": "clark2019"},
    "kovaleva2019": {"attention_mode": "padded"},
}


def resolve(config: CompareConfig) -> CompareConfig:
    """``config`` with every open convention (``None``) set from its preset; one clear error for bad names."""
    if config.conventions not in PRESETS:
        raise BertologyError(f"Unknown conventions preset {config.conventions!r}; choose from: {', '.join(PRESETS)}.")
    preset = PRESETS[config.conventions]
    changes = {}
    for conv in CONVENTIONS:
        value = getattr(config, conv.field)
        if value is None:
            value = preset.get(conv.field, conv.default)
        if value not in conv.choices:
            raise BertologyError(f"Unknown {conv.field} {value!r}; choose from: {', '.join(conv.choices)}.")
        changes[conv.field] = value
    return dataclasses.replace(config, **changes)


def describe(config: CompareConfig) -> dict:
    """The manifest's record: the preset, and each convention's value and the paper it comes from."""
    return {"preset": config.conventions} | {
        conv.field: {"value": getattr(config, conv.field), "source": conv.choices.get(getattr(config, conv.field), "?")}
        for conv in CONVENTIONS
    }
