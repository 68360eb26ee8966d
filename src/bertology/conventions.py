"""Paper conventions, named and switchable: where bertology and a paper's own code count differently.

Each :class:`Convention` is one setting of :class:`~bertology.config.CompareConfig` with the choices
it takes and the paper each choice reproduces. A preset (``--conventions clark2019``) sets several
at once; a setting the user gives explicitly wins over the preset. :func:`resolve` fills the
settings left open (``None``) from the preset, once, at the start of ``compare``;
:func:`describe` is what the manifest records, so every table can be traced to its conventions.

Only conventions that reproduce the paper's number are offered here. Others the papers differ in
(Clark's relation heads from the first word piece, Clark's head map and entropy smoothing,
Kovaleva's word categories, Hewitt's punctuation list) are listed in the README as not yet switchable.
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
)

#: Preset -> the conventions it sets (the others keep bertology's).
PRESETS: Mapping[str, Mapping[str, str]] = {
    "bertology": {},
    "clark2019": {"punctuation": "clark2019"},
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
