"""User-given token relations: a JSONL file of texts with a *from* span and one or more *to* spans.

Each line is one relation instance, e.g. an aspect word and its opinion words, or a pronoun and its
antecedent::

    {"text": "The food was great but the service was slow.", "from": "food", "to": "great", "relation": "aspect-opinion"}
    {"text": "The dog barked because it was hungry.", "from": "it", "to": ["The dog"], "relation": "coref"}
    {"text": "...", "from": [4, 8], "to": [[13, 18], [30, 34]]}

A span is either a string, which must occur exactly once in the text as whole words, or a
``[start, end)`` character range. ``relation`` defaults to ``"custom"``. Texts are split into words
with a BERT-style basic pre-tokenisation (runs of letters/digits, and single punctuation marks), so
sub-word pieces align to those words; a span covers every word it overlaps.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError

#: Words as BERT's basic tokenizer splits them: runs of word characters, or one other non-space char.
WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)
DEFAULT_RELATION = "custom"


@dataclass(frozen=True)
class SpanRelation:
    """One relation instance: the words of the *from* span and the words of all *to* spans.

    ``example`` is the index of the instance's text in the corpus built by :func:`load_span_relations`;
    word indices are 0-based into that example's ``words``.
    """

    example: int
    relation: str
    source: tuple[int, ...]
    targets: tuple[int, ...]
    #: For a sentence pair whose spans may lie in either text: the first text's word count; word indices
    #: then run over both texts, the second's after the first's (None: the first text only).
    n_first_words: int | None = None


def split_words(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """Words of ``text`` and their ``[start, end)`` character offsets."""
    matches = list(WORD.finditer(text))
    return [m.group() for m in matches], [m.span() for m in matches]


def _char_span(text: str, span, where: str) -> tuple[int, int]:
    """A span given as a string (whole words, exactly once) or ``[start, end)`` -> character range."""
    if isinstance(span, str):
        if not span.strip():
            raise BertologyError(f"{where}: empty span")
        pattern = r"(?<!\w)" + re.escape(span.strip()) + r"(?!\w)"
        found = [m.span() for m in re.finditer(pattern, text)]
        if not found:
            raise BertologyError(f"{where}: span {span!r} does not occur as whole words in the text")
        if len(found) > 1:
            raise BertologyError(
                f"{where}: span {span!r} occurs {len(found)} times in the text; give it as [start, end) "
                f"character offsets instead (e.g. {list(found[0])})"
            )
        return found[0]
    if (
        isinstance(span, (list, tuple))
        and len(span) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in span)
    ):
        start, end = span
        if not 0 <= start < end <= len(text):
            raise BertologyError(f"{where}: character range {list(span)} is outside the text (length {len(text)})")
        return start, end
    raise BertologyError(f"{where}: a span must be a string or [start, end) character offsets, not {span!r}")


def _words_in(offsets: list[tuple[int, int]], start: int, end: int) -> list[int]:
    return [i for i, (s, e) in enumerate(offsets) if s < end and e > start]


def _to_spans(value, where: str) -> list:
    """``to`` may be one span or a list of spans; ``[3, 7]`` is one character range, not two spans."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(x, int) for x in value):
        return [value]
    if isinstance(value, (list, tuple)) and value:
        return list(value)
    raise BertologyError(f"{where}: 'to' must be a span or a non-empty list of spans, not {value!r}")


def parse_span_relation(record: dict, where: str) -> tuple[Example, str, list[int], list[int]]:
    """One JSONL record -> (example with words, relation name, from-word indices, to-word indices)."""
    if not isinstance(record, dict):
        raise BertologyError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = [k for k in ("text", "from", "to") if k not in record]
    if missing:
        raise BertologyError(f"{where}: missing key(s) {', '.join(missing)} (need text, from, to; relation optional)")
    text = record["text"]
    if not isinstance(text, str) or not text.strip():
        raise BertologyError(f"{where}: 'text' must be a non-empty string")
    relation = str(record.get("relation") or DEFAULT_RELATION)
    words, offsets = split_words(text)
    source = _words_in(offsets, *_char_span(text, record["from"], f"{where} 'from'"))
    targets: list[int] = []
    for span in _to_spans(record["to"], where):
        targets.extend(_words_in(offsets, *_char_span(text, span, f"{where} 'to'")))
    if not source:
        raise BertologyError(f"{where}: the 'from' span covers no word")
    targets = sorted(set(targets) - set(source))
    if not targets:
        raise BertologyError(f"{where}: the 'to' spans cover no word outside the 'from' span")
    return Example(text=text, words=tuple(words)), relation, source, targets


def load_span_relations(path: str | Path) -> tuple[Corpus, list[SpanRelation]]:
    """Read a relations JSONL file into a corpus (one example per line) and its relation instances."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise BertologyError(f"Relations file not found: {p}")
    try:
        raw = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise BertologyError(f"{p} is not UTF-8 text (byte {err.start})") from None
    examples: list[Example] = []
    relations: list[SpanRelation] = []
    for lineno, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{p.name} line {lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise BertologyError(f"{where}: not valid JSON ({err.msg})") from None
        example, relation, source, targets = parse_span_relation(record, where)
        relations.append(SpanRelation(len(examples), relation, tuple(source), tuple(targets)))
        examples.append(example)
    if not relations:
        raise BertologyError(f"{p} holds no relation (expected JSON lines with text, from, to)")
    corpus = Corpus(
        examples,
        name=p.stem,
        source=str(p),
        stats={"file_sha256": hashlib.sha256(raw.encode()).hexdigest(), "n_relations": len(relations)},
    )
    return corpus, relations
