"""How a picked extreme reads: with the decimals that tell it from the runner-up, or "all equal" when nothing does.

A headline that names the head with the lowest cosine must not read ``L6H2 (1.000)`` beside heads that also read
``1.000``: the ranking would rest on differences the reader cannot see. The summary lines (``Run.summary``, the
command line, the notebook card) and the report's headline cards format their picks with these helpers:

- :func:`decimals_to_tell` gives the decimals at which each picked value reads differently from the value ranked
  after it (the default when it already does, a few more when that is what it takes);
- :func:`all_read_the_same` says when every value reads the same at the default decimals: then nothing is ranked,
  and :func:`bound_text` says so ("all 72 heads ≥ 0.9995").

Pure text helpers over plain floats; no table and no section is known here.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["DIGITS", "MOST", "all_read_the_same", "bound_text", "decimals_to_tell", "fixed", "picks_text", "significant_to_tell", "ties"]

#: Decimals a headline shows by default (cosines, divergences, accuracies).
DIGITS = 3
#: The most decimals a headline shows to tell a pick from its runner-up; a tie beyond them is a tie.
MOST = 6


def _clean(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and not math.isnan(float(v))]


def fixed(value: float, decimals: int) -> str:
    """``value`` with ``decimals`` decimals (``-0.000`` written ``0.000``)."""
    text = f"{float(value):.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def decimals_to_tell(ranked: Sequence[float], picked: int = 1, digits: int = DIGITS, most: int = MOST) -> int:
    """Decimals at which each of the first ``picked`` values of ``ranked`` (in rank order, the extreme first) reads
    differently from the value ranked after it: ``digits`` when they already do, more (up to ``most``) when that
    is what it takes. Values equal beyond ``most`` decimals are a tie no precision breaks (see :func:`ties`); they
    do not raise the decimals."""
    values = _clean(ranked)
    pairs = [(values[i], values[i + 1]) for i in range(min(picked, len(values) - 1))]
    need = digits
    for a, b in pairs:
        if fixed(a, most) == fixed(b, most):  # a real tie: more decimals would not tell them apart
            continue
        d = digits
        while d < most and fixed(a, d) == fixed(b, d):
            d += 1
        need = max(need, d)
    return need


def significant_to_tell(ranked: Sequence[float], picked: int = 1, sig: int = DIGITS, most: int = MOST) -> int:
    """As :func:`decimals_to_tell`, in significant digits (``f"{v:.{n}g}"``): for values of any size, such as a
    relative change of weights."""
    values = _clean(ranked)
    need = sig
    for a, b in [(values[i], values[i + 1]) for i in range(min(picked, len(values) - 1))]:
        if f"{a:.{most}g}" == f"{b:.{most}g}":
            continue
        n = sig
        while n < most and f"{a:.{n}g}" == f"{b:.{n}g}":
            n += 1
        need = max(need, n)
    return need


def ties(ranked: Sequence[float], most: int = MOST) -> int:
    """How many values after the first read the same as it at ``most`` decimals (0: the first stands alone)."""
    values = _clean(ranked)
    if not values:
        return 0
    first = fixed(values[0], most)
    return sum(1 for v in values[1:] if fixed(v, most) == first)


def all_read_the_same(values: Sequence[float], digits: int = DIGITS) -> bool:
    """Whether every value reads the same at ``digits`` decimals (with at least two values): a ranking of them would
    rest on differences the reader cannot see."""
    clean = _clean(values)
    return len(clean) > 1 and len({fixed(v, digits) for v in clean}) == 1


def bound_text(values: Sequence[float], *, lowest: bool, digits: int = DIGITS) -> str:
    """The bound every value keeps when they all read the same at ``digits`` decimals: ``≥ 0.9995`` (``lowest``:
    the pick was the smallest) or ``≤ 0.0005``; values that are all exactly equal read ``= 1.000``."""
    clean = _clean(values)
    if max(clean) == min(clean):
        return f"= {fixed(clean[0], digits)}"
    shown = float(fixed(clean[0], digits))
    half = 0.5 * 10 ** -digits
    return f"≥ {fixed(shown - half, digits + 1)}" if lowest else f"≤ {fixed(shown + half, digits + 1)}"


def picks_text(labels: Sequence[str], ranked: Sequence[float], picked: int, *, lowest: bool, noun: str = "heads",
               digits: int = DIGITS) -> str:
    """The first ``picked`` of ``labels`` with their values, ``L1H3 (0.841), L2H2 (0.942)``, in the decimals that tell
    each from the next one ranked; when every value reads the same at ``digits`` decimals, ``all 72 heads ≥ 0.9995``
    instead (nothing to rank at the shown precision)."""
    kept = [(label, float(v)) for label, v in zip(labels, ranked) if v is not None and not math.isnan(float(v))]
    values = [v for _, v in kept]
    if all_read_the_same(values, digits):
        return f"all {len(values):,} {noun} {bound_text(values, lowest=lowest, digits=digits)}"
    d = decimals_to_tell(values, picked, digits)
    return ", ".join(f"{label} ({fixed(v, d)})" for label, v in kept[:picked])
