"""SQuAD v1.1 / v2.0 JSON: questions over paragraphs, each answer a span of its paragraph.

The layout (both versions): ``{"version": ..., "data": [article, ...]}``; an article has ``title`` and
``paragraphs``; a paragraph has ``context`` and ``qas``; a question has ``id``, ``question`` and
``answers`` (``[{"text", "answer_start"}]``, ``answer_start`` a character offset into the context).
v2.0 adds ``is_impossible`` (then ``answers`` is empty and ``plausible_answers`` holds the distractor
spans, which are read for the record but never trained on or scored).

:func:`read_squad` checks every answer against its context: the text at ``answer_start`` must be the
answer's text, else one clear error naming the file, the question id and both strings. A question of
a v1.1 file without an answer cannot be trained on or scored; it is skipped and counted in
``stats["n_skipped_no_answer"]`` (the manifest's data section), as are the unanswerable questions
(``stats["n_unanswerable"]``).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bertology.data.corpus import Example
from bertology.errors import BertologyError


@dataclass(frozen=True)
class QAExample:
    """One question over one context. ``answers`` are ``(text, answer_start)`` pairs (empty when unanswerable)."""

    id: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]
    is_impossible: bool = False
    article: int = 0  # index of the article in the file: the unit of a split by article
    plausible_answers: tuple[tuple[str, int], ...] = ()

    @property
    def answer_texts(self) -> list[str]:
        """The gold answers' texts (empty for an unanswerable question)."""
        return [t for t, _ in self.answers]


@dataclass
class SquadData:
    """The questions of a SQuAD file, in file order, with provenance (the QA counterpart of a Corpus)."""

    examples: list[QAExample]
    name: str = "squad"
    source: str = "python list"
    version: str = ""
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self) -> Iterator[QAExample]:
        return iter(self.examples)

    def __getitem__(self, i: int) -> QAExample:
        return self.examples[i]

    @property
    def with_negative(self) -> bool:
        """Whether questions may have no answer (SQuAD v2.0): then a model may predict no answer."""
        return self.version.startswith("v2") or any(ex.is_impossible for ex in self.examples)

    def fingerprint(self, word_tags: bool = False) -> str:
        """SHA-256 of the questions' content: equal data give equal fingerprints (``word_tags``, as
        :meth:`Corpus.fingerprint` takes it, changes nothing: questions carry no word tags)."""
        digest = hashlib.sha256()
        for ex in self.examples:
            digest.update(json.dumps([ex.id, ex.question, ex.context, ex.answers, ex.is_impossible, ex.article]).encode())
        return digest.hexdigest()

    def subset(self, indices: Sequence[int], name: str | None = None) -> "SquadData":
        """A new data set with the chosen questions, in the given order."""
        return SquadData([self.examples[i] for i in indices], name or self.name, self.source, self.version, dict(self.stats))

    def stratified_sample(self, n: int | None, seed: int) -> "SquadData":
        """A seeded sample of ``n`` questions (answerable / unanswerable kept in proportion), in file order."""
        if n is None or n >= len(self):
            return self
        from sklearn.model_selection import train_test_split

        idx = list(range(len(self)))
        strata = [ex.is_impossible for ex in self.examples]
        try:
            keep, _ = train_test_split(idx, train_size=n, random_state=seed, stratify=strata)
        except ValueError:
            keep, _ = train_test_split(idx, train_size=n, random_state=seed)
        out = self.subset(sorted(int(i) for i in keep))
        out.stats["sampled_to"] = n
        return out

    def describe(self) -> dict:
        """Provenance for manifest.json (with the counts of unanswerable and skipped questions)."""
        return {
            "name": self.name, "source": self.source, "format": "squad", "version": self.version,
            "n_examples": len(self), "n_articles": len({ex.article for ex in self.examples}),
            "n_unanswerable": sum(ex.is_impossible for ex in self.examples), "sha256": self.fingerprint(),
            **{k: v for k, v in self.stats.items() if k != "n_unanswerable"},
        }


def _error(path: Path, where: str, msg: str) -> BertologyError:
    return BertologyError(f"{path}: {where}: {msg}")


def _answers(path: Path, qid: str, context: str, raw, key: str) -> tuple[tuple[str, int], ...]:
    """The ``(text, start)`` pairs of one question's ``answers`` (or ``plausible_answers``), each checked."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _error(path, f"question {qid!r}", f"{key!r} must be a list of {{text, answer_start}}, not {type(raw).__name__}.")
    out = []
    for k, a in enumerate(raw):
        if not isinstance(a, dict) or "text" not in a or "answer_start" not in a:
            raise _error(path, f"question {qid!r}", f"{key}[{k}] needs 'text' and 'answer_start'.")
        text, start = a["text"], a["answer_start"]
        if not isinstance(text, str) or isinstance(start, bool) or not isinstance(start, int):
            raise _error(path, f"question {qid!r}", f"{key}[{k}] must have a string 'text' and an integer 'answer_start'.")
        found = context[start : start + len(text)] if 0 <= start <= len(context) else None
        if found != text:
            shown = "outside the context" if found is None else repr(found)
            raise _error(
                path, f"question {qid!r}",
                f"{key}[{k}] text {text!r} does not match the context at answer_start={start} (the context there reads "
                f"{shown}); fix the offset (a character index into the context) or the answer text.",
            )
        out.append((text, int(start)))
    return tuple(out)


def read_squad(path: str | Path, name: str | None = None) -> SquadData:
    """Read a SQuAD v1.1 or v2.0 JSON file; one clear error (file, question id) for anything malformed."""
    path = Path(path)
    if not path.is_file():
        raise BertologyError(f"{path}: no such SQuAD file.")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise BertologyError(f"{path}: line {err.lineno}, column {err.colno}: not valid JSON ({err.msg}); question "
                             "answering reads SQuAD v1.1/v2.0 JSON files.") from None
    except UnicodeDecodeError as err:
        raise BertologyError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}).") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise BertologyError(f"{path}: not a SQuAD file (expected an object with a 'data' list of articles).")
    examples: list[QAExample] = []
    seen: set[str] = set()
    skipped: list[str] = []
    n_plausible = 0
    for a, article in enumerate(doc["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise _error(path, f"article {a}", "needs a 'paragraphs' list.")
        for p, para in enumerate(paragraphs):
            if not isinstance(para, dict) or not isinstance(para.get("context"), str) or not isinstance(para.get("qas"), list):
                raise _error(path, f"article {a}, paragraph {p}", "needs a string 'context' and a 'qas' list.")
            context = para["context"]
            for q, qa in enumerate(para["qas"]):
                if not isinstance(qa, dict) or not isinstance(qa.get("question"), str) or "id" not in qa:
                    raise _error(path, f"article {a}, paragraph {p}, question {q}", "needs an 'id' and a string 'question'.")
                qid = str(qa["id"])
                if qid in seen:
                    raise _error(path, f"question {qid!r}", "the id occurs twice; question ids must be unique.")
                seen.add(qid)
                impossible = bool(qa.get("is_impossible", False))
                answers = _answers(path, qid, context, qa.get("answers", []), "answers")
                plausible = _answers(path, qid, context, qa.get("plausible_answers"), "plausible_answers")
                n_plausible += bool(plausible)
                if impossible and answers:
                    raise _error(path, f"question {qid!r}", "is_impossible is true but the question has answers; "
                                 "an unanswerable question's answers must be empty.")
                if not impossible and not answers:
                    skipped.append(qid)
                    continue
                examples.append(QAExample(qid, qa["question"], context, answers, impossible, a, plausible))
    if not examples:
        raise BertologyError(f"{path}: no question with an answer (or marked is_impossible) to read.")
    version = str(doc.get("version", ""))
    stats = {"n_skipped_no_answer": len(skipped), "n_with_plausible_answers": n_plausible}
    if skipped:
        stats["skipped_ids"] = skipped[:20]
    return SquadData(examples, name or path.stem, str(path), version, stats)


def squad_pairs(data: SquadData) -> tuple[list[Example], dict]:
    """Each question with its context as an unlabelled sentence pair, and the reader's stats: the corpus that
    ``compare`` and ``track`` read from a SQuAD file (the model's input without the answer)."""
    examples = [Example(text=ex.question, text_pair=ex.context) for ex in data]
    return examples, {"format": "squad", "version": data.version, "n_unanswerable": sum(ex.is_impossible for ex in data),
                      **data.stats}
