"""Tiny SemEval-2014-style ABSA files for the tests (restaurant layout with categories, laptop without)."""
from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import quoteattr, escape

#: (id, text, [(term, polarity)], [(category, polarity)]); offsets are computed from the first match.
RESTAURANT = [
    ("1", "the food was great .", [("food", "positive")], [("food", "positive")]),
    ("2", "the service was slow but the food was good .", [("service", "negative"), ("food", "positive")],
     [("service", "negative"), ("food", "positive")]),
    ("3", "i love this place .", [], [("anecdotes/miscellaneous", "positive")]),
    ("4", "the price was bad .", [("price", "negative")], [("price", "negative")]),
    ("5", "the food was good but the food was also bad .", [("food", "conflict")], [("food", "conflict")]),
    ("6", "the staff were very funny .", [("staff", "positive")], [("service", "positive")]),
    ("7", "the music was awful but the dog was great .", [("music", "negative")], [("ambience", "negative")]),
    ("8", "a great day with good food .", [("food", "positive")], [("food", "positive"), ("anecdotes/miscellaneous", "positive")]),
    ("9", "the waiter was slow .", [("waiter", "negative")], [("service", "negative")]),
    ("10", "the food was bad and the price was too big .", [("food", "negative"), ("price", "negative")],
     [("food", "negative"), ("price", "negative")]),
]

LAPTOP = [
    ("L1", "the screen is great but the battery is bad .", [("screen", "positive"), ("battery", "negative")], []),
    ("L2", "i like the keyboard .", [("keyboard", "positive")], []),
    ("L3", "it is a laptop .", [], []),
]


def absa_xml(rows, bad_offset: str | None = None) -> str:
    """The XML of ``rows``; ``bad_offset`` = a sentence id whose first term gets offsets one too far."""
    out = ['<?xml version="1.0" encoding="UTF-8"?>', "<sentences>"]
    for sid, text, terms, cats in rows:
        out.append(f"  <sentence id={quoteattr(sid)}>\n    <text>{escape(text)}</text>")
        if terms:
            out.append("    <aspectTerms>")
            for k, (term, pol) in enumerate(terms):
                start = text.index(term)
                if sid == bad_offset and k == 0:
                    start += 1
                out.append(f'      <aspectTerm term={quoteattr(term)} polarity="{pol}" from="{start}" to="{start + len(term)}"/>')
            out.append("    </aspectTerms>")
        if cats:
            out.append("    <aspectCategories>")
            out += [f'      <aspectCategory category={quoteattr(c)} polarity="{p}"/>' for c, p in cats]
            out.append("    </aspectCategories>")
        out.append("  </sentence>")
    out.append("</sentences>")
    return "\n".join(out) + "\n"


def write_absa(path: Path, rows=RESTAURANT, **kw) -> Path:
    path.write_text(absa_xml(rows, **kw), encoding="utf-8")
    return path
