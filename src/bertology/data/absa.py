"""SemEval-2014 Task 4 (aspect-based sentiment) XML, and the sentence-pair tasks of Sun et al. (2019).

The files hold ``<sentence id>`` elements with a ``<text>``, optional ``<aspectTerms>`` (``term``,
``polarity``, character offsets ``from``/``to``) and, for restaurants only, ``<aspectCategories>``
(``category``, ``polarity``). :func:`read_absa` reads one file (restaurants or laptops) and checks
every offset against its term; :func:`absa_pairs` builds the auxiliary-sentence tasks:

``qa_m``
    category level: (review, ``"what do you think of the {category} of it ?"``) for every category of
    the file, labelled with the category's polarity in the sentence or ``none`` when it is absent;
``nli_m``
    the same with the bare category (``"{category}"``) as the second sentence;
``term_qa_m`` / ``term_nli_m``
    term level (the only kind laptop files allow): one pair per aspect term, the question naming the
    term, labelled with its polarity.

Labels are ``positive / negative / neutral / conflict / none``; ``conflict`` items are kept (counted)
or dropped (counted) with ``conflict="drop"``.

SemEval-2014 restaurants does not link terms to categories. :func:`term_categories` uses a
documented rule: when a sentence has exactly one category other than ``anecdotes/miscellaneous`` (or
exactly one category at all) its terms belong to it; otherwise a term belongs to the category whose
small lexicon (:data:`CATEGORY_LEXICON`) holds one of its words, when that category is in the
sentence; every other term is *ambiguous*, left out of the relations and counted.
"""
from __future__ import annotations

import hashlib
import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError

PairStyle = Literal["qa_m", "nli_m", "term_qa_m", "term_nli_m"]
STYLES: tuple[str, ...] = ("qa_m", "nli_m", "term_qa_m", "term_nli_m")
POLARITIES = ("positive", "negative", "neutral", "conflict")
NONE = "none"
MISC = "anecdotes/miscellaneous"
QA_TEMPLATE = "what do you think of the {} of it ?"

#: Words that place a term in a category when the sentence has several (lower-case, whole words).
CATEGORY_LEXICON: dict[str, frozenset[str]] = {
    "food": frozenset("""food foods dish dishes meal meals menu pizza sushi fish chicken beef pork steak pasta
        salad soup dessert desserts appetizer appetizers entree entrees bread rice noodles sauce wine drinks drink
        coffee tea beer cheese burger burgers sandwich sandwiches portions portion flavor taste cuisine kitchen
        chef breakfast lunch dinner brunch seafood shrimp lobster tuna salmon rolls roll specials fries""".split()),
    "service": frozenset("""service staff waiter waiters waitress waitresses server servers hostess host manager
        owner owners bartender bartenders delivery reservation reservations wait""".split()),
    "price": frozenset("""price prices priced cost costs bill check value money""".split()),
    "ambience": frozenset("""ambience ambiance atmosphere decor music place room setting space interior
        lighting seating tables table view vibe crowd garden patio outdoor""".split()),
}

_WORDS = re.compile(r"\w+")


@dataclass(frozen=True)
class AspectTerm:
    """An aspect term of a sentence: its text, polarity and ``[start, end)`` character offsets."""

    term: str
    polarity: str
    start: int
    end: int


@dataclass(frozen=True)
class AspectCategory:
    category: str
    polarity: str


@dataclass(frozen=True)
class AbsaSentence:
    id: str
    text: str
    terms: tuple[AspectTerm, ...] = ()
    categories: tuple[AspectCategory, ...] = ()


@dataclass(frozen=True)
class AbsaData:
    """One SemEval-2014 file: its sentences, the categories it uses (file order) and its SHA-256."""

    path: str
    sentences: tuple[AbsaSentence, ...]
    categories: tuple[str, ...]
    sha256: str

    @property
    def has_categories(self) -> bool:
        return bool(self.categories)


@dataclass(frozen=True)
class AbsaPair:
    """One auxiliary-sentence pair: the review, the question, its label and what the relations need.

    ``aspect_span`` is the ``[start, end)`` range of the category or term inside ``question``;
    ``target_terms`` the review terms of that aspect (category: by :func:`term_categories`; term: the
    term itself), ``other_terms`` the terms of other aspects, ``present`` whether the aspect is in
    the sentence (False only for ``none`` items).
    """

    sentence_id: str
    text: str
    question: str
    label: str
    aspect: str
    aspect_span: tuple[int, int]
    target_terms: tuple[AspectTerm, ...] = ()
    other_terms: tuple[AspectTerm, ...] = ()
    present: bool = True


@dataclass
class AbsaPairs:
    """The pairs of one task and the counts the manifest records."""

    pairs: list[AbsaPair]
    style: str
    counts: dict = field(default_factory=dict)

    def corpus(self, name: str = "absa", source: str = "absa") -> Corpus:
        """The pairs as a labelled sentence-pair corpus (review first, question second)."""
        examples = [Example(text=p.text, text_pair=p.question, label=p.label) for p in self.pairs]
        return Corpus(examples, name=name, source=source)


def _attr(el: ET.Element, key: str, where: str) -> str:
    value = el.get(key)
    if value is None:
        raise BertologyError(f"{where}: <{el.tag}> has no '{key}' attribute")
    return value


def read_absa(path: str | Path) -> AbsaData:
    """Read a SemEval-2014 ABSA XML file; a term whose offsets do not cover its text is an error."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise BertologyError(f"ABSA file not found: {p}")
    raw = p.read_bytes()
    try:
        root = ET.fromstring(raw)
    except ET.ParseError as err:
        raise BertologyError(f"{p.name} is not valid XML ({err})") from None
    sentences, categories = [], []
    for el in root.iter("sentence"):
        sid = el.get("id", "?")
        where = f"{p.name}, sentence {sid}"
        text_el = el.find("text")
        if text_el is None or not (text_el.text or "").strip():
            raise BertologyError(f"{where}: no <text>")
        text = text_el.text
        terms = []
        for t in el.iter("aspectTerm"):
            term, polarity = _attr(t, "term", where), _attr(t, "polarity", where)
            try:
                start, end = int(_attr(t, "from", where)), int(_attr(t, "to", where))
            except ValueError:
                raise BertologyError(f"{where}: aspect term {term!r} has non-integer offsets") from None
            if text[start:end] != term:
                raise BertologyError(
                    f"{where}: aspect term {term!r} has offsets from={start} to={end}, which cover "
                    f"{text[start:end]!r} in the text; fix the offsets or the term")
            terms.append(AspectTerm(term, polarity, start, end))
        cats = []
        for c in el.iter("aspectCategory"):
            cat = AspectCategory(_attr(c, "category", where), _attr(c, "polarity", where))
            cats.append(cat)
            if cat.category not in categories:
                categories.append(cat.category)
        for polarity in [t.polarity for t in terms] + [c.polarity for c in cats]:
            if polarity not in POLARITIES:
                raise BertologyError(f"{where}: unknown polarity {polarity!r} (expected {', '.join(POLARITIES)})")
        sentences.append(AbsaSentence(sid, text, tuple(terms), tuple(cats)))
    if not sentences:
        raise BertologyError(f"{p.name} holds no <sentence> element")
    # misc last, as in the files' documentation; the rest in order of first appearance
    categories.sort(key=lambda c: c == MISC)
    return AbsaData(str(p), tuple(sentences), tuple(categories), hashlib.sha256(raw).hexdigest())


def term_categories(sentence: AbsaSentence) -> list[str | None]:
    """The category of each term of ``sentence`` by the module's rule; None where it stays ambiguous."""
    present = [c.category for c in sentence.categories]
    specific = [c for c in present if c != MISC]
    if len(specific) == 1:
        return [specific[0]] * len(sentence.terms)
    if len(present) == 1:
        return [present[0]] * len(sentence.terms)
    out: list[str | None] = []
    for t in sentence.terms:
        words = {w.lower() for w in _WORDS.findall(t.term)}
        hits = [c for c in specific if words & CATEGORY_LEXICON.get(c, frozenset())]
        out.append(hits[0] if len(hits) == 1 else None)
    return out


def question_for(aspect: str, style: str) -> tuple[str, tuple[int, int]]:
    """The auxiliary sentence naming ``aspect`` and the aspect's character range inside it."""
    if style.endswith("nli_m"):
        return aspect, (0, len(aspect))
    head = QA_TEMPLATE.split("{}")[0]
    return QA_TEMPLATE.format(aspect), (len(head), len(head) + len(aspect))


def absa_pairs(data: AbsaData, style: PairStyle = "qa_m", conflict: Literal["keep", "drop"] = "keep",
               sentence_ids: Sequence[str] | None = None) -> AbsaPairs:
    """The sentence-pair task ``style`` of Sun et al. (2019) from ``data`` (optionally only ``sentence_ids``)."""
    if style not in STYLES:
        raise BertologyError(f"Unknown ABSA pair style {style!r}; choose from {', '.join(STYLES)}.")
    if conflict not in ("keep", "drop"):
        raise BertologyError(f"conflict must be 'keep' or 'drop', not {conflict!r}")
    term_level = style.startswith("term_")
    if not term_level and not data.has_categories:
        raise BertologyError(
            f"{Path(data.path).name} has no aspect categories (a laptop file?); use a term-level style "
            "(term_qa_m or term_nli_m).")
    wanted = None if sentence_ids is None else set(sentence_ids)
    pairs: list[AbsaPair] = []
    counts: Counter = Counter()
    for s in data.sentences:
        if wanted is not None and s.id not in wanted:
            continue
        counts["n_sentences"] += 1
        cats = term_categories(s) if data.has_categories else [None] * len(s.terms)
        counts["n_terms"] += len(s.terms)
        counts["n_terms_ambiguous_category"] += sum(c is None for c in cats) if data.has_categories else 0
        if term_level:
            items = [(t.term, t.polarity, (t,), tuple(o for o in s.terms if o is not t), True) for t in s.terms]
            if not s.terms:
                counts["n_sentences_without_terms"] += 1
        else:
            polarity = {c.category: c.polarity for c in s.categories}
            items = []
            for cat in data.categories:
                mine = tuple(t for t, c in zip(s.terms, cats) if c == cat)
                others = tuple(t for t, c in zip(s.terms, cats) if c is not None and c != cat)
                items.append((cat, polarity.get(cat, NONE), mine, others, cat in polarity))
        for aspect, label, mine, others, present in items:
            if label == "conflict":
                counts["n_conflict"] += 1
                if conflict == "drop":
                    counts["n_conflict_dropped"] += 1
                    continue
            question, span = question_for(aspect, style)
            pairs.append(AbsaPair(s.id, s.text, question, label, aspect, span, mine, others, present))
    counts["n_pairs"] = len(pairs)
    if not pairs:
        which = "its sentences" if wanted is None else f"the {counts['n_sentences']} sentence(s) of this split"
        raise BertologyError(f"{Path(data.path).name}: no {style} pair could be built from {which} (no aspect terms?); "
                             "use more sentences or another --seed.")
    labels = Counter(p.label for p in pairs)
    out = {"file": data.path, "file_sha256": data.sha256, "style": style, "conflict": conflict,
           "categories": list(data.categories), **{k: int(v) for k, v in counts.items()},
           "labels": dict(sorted(labels.items()))}
    out.setdefault("n_conflict", 0)
    out.setdefault("n_conflict_dropped", 0)
    return AbsaPairs(pairs, style, out)


def split_sentences(data: AbsaData, eval_fraction: float, seed: int, max_sentences: int | None = None
                    ) -> tuple[list[str], list[str]]:
    """Seeded split of sentence ids into train and held out (pairs of one sentence never straddle it).

    With ``max_sentences`` a seeded sample of that many sentences is split.
    """
    import numpy as np

    if not 0 < eval_fraction < 1:
        raise BertologyError(f"eval_fraction must be between 0 and 1 (exclusive), not {eval_fraction!r}")
    ids = [s.id for s in data.sentences]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(ids))
    if max_sentences is not None:
        order = order[:max_sentences]
    n_eval = max(1, int(round(len(order) * eval_fraction)))
    if n_eval >= len(order):
        raise BertologyError(f"{len(order)} sentence(s) cannot be split into train and held out")
    held = sorted(int(i) for i in order[:n_eval])
    train = sorted(int(i) for i in order[n_eval:])
    return [ids[i] for i in train], [ids[i] for i in held]


#: Parts of speech (Universal POS) that count as opinion words.
OPINION_POS = frozenset({"ADJ", "VERB"})
#: How many dependency arcs an opinion word may be from a token of its term.
OPINION_ARCS = 2


def opinion_spans_in_doc(doc, terms: Sequence[AspectTerm]) -> tuple[tuple[int, int], ...]:
    """Character spans of the opinion words of ``terms`` in a parsed review (a spaCy ``Doc``).

    The rule: tokens tagged ADJ or VERB (auxiliaries are AUX, so "was" is not one) within
    :data:`OPINION_ARCS` dependency arcs (up to the head or down to a dependent, in any order) of
    a token of a term, other than the terms' own tokens. "The food was great": food <- was -> great.
    """
    term_tokens = {t.i for term in terms for t in doc if t.idx < term.end and t.idx + len(t.text) > term.start}
    frontier, seen = set(term_tokens), set(term_tokens)
    for _ in range(OPINION_ARCS):
        nxt = set()
        for i in frontier:
            tok = doc[i]
            for n in [tok.head, *tok.children]:
                if n.i not in seen:
                    nxt.add(n.i)
        seen |= nxt
        frontier = nxt
    picked = sorted(i for i in seen - term_tokens if doc[i].pos_ in OPINION_POS)
    return tuple((doc[i].idx, doc[i].idx + len(doc[i].text)) for i in picked)


def opinion_spans(pairs: Sequence[AbsaPair], nlp=None, nlp_name: str | None = None, batch_size: int = 64
                  ) -> list[tuple[tuple[int, int], ...]]:
    """The opinion-word spans of each pair's target terms (:func:`opinion_spans_in_doc`); reviews parsed once."""
    if nlp is None:
        from bertology.data.annotate import load_spacy

        nlp = load_spacy(nlp_name)
    texts = sorted({p.text for p in pairs if p.target_terms})
    docs = dict(zip(texts, nlp.pipe(texts, batch_size=batch_size)))
    return [opinion_spans_in_doc(docs[p.text], p.target_terms) if p.target_terms else () for p in pairs]
