"""The corpus: sentences (or sentence pairs), optional labels, optional gold annotations.

A :class:`Corpus` is an immutable list of :class:`Example` plus a record of where it came from and
what was dropped while reading it, so no example disappears silently.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from bertology.errors import BertologyError


@dataclass(frozen=True)
class Example:
    """One input: a sentence, or a pair; with an optional label and optional word-level annotations.

    ``words``/``upos``/``heads``/``deprels`` (and ``xpos``) come from CoNLL-U (or a parser). ``heads`` are 1-based word
    indices with 0 for the root, as in CoNLL-U. When ``words`` is set, the text is still tokenised as it
    is (the model reads its own tokens) and each token is given to the word holding its first character
    (:func:`bertology.data.encode.encode_example`).

    For a sentence pair, ``n_first_words`` set means the annotations cover both texts: the first
    ``n_first_words`` words are ``text``'s, the rest ``text_pair``'s, and ``heads`` index the
    concatenation (each sentence's tree stays inside its sentence).
    """

    text: str
    text_pair: str | None = None
    label: str | None = None
    words: tuple[str, ...] | None = None
    upos: tuple[str, ...] | None = None
    heads: tuple[int, ...] | None = None
    deprels: tuple[str, ...] | None = None
    n_first_words: int | None = None
    xpos: tuple[str, ...] | None = None  # language-specific tags (PTB for English: CoNLL-U XPOS, spaCy tag_)
    tags: tuple[str, ...] | None = None  # one tag per word from a tag file (CoNLL-2003 BIO): a tagging task's targets


@dataclass
class Corpus:
    """An ordered collection of examples with provenance."""

    examples: list[Example]
    name: str = "corpus"
    source: str = "python list"
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self) -> Iterator[Example]:
        return iter(self.examples)

    def __getitem__(self, i: int) -> Example:
        return self.examples[i]

    @property
    def has_pairs(self) -> bool:
        return any(ex.text_pair is not None for ex in self.examples)

    @property
    def has_labels(self) -> bool:
        return bool(self.examples) and all(ex.label is not None for ex in self.examples)

    @property
    def has_trees(self) -> bool:
        return bool(self.examples) and all(ex.heads is not None for ex in self.examples)

    def label_set(self) -> list[str]:
        """Sorted distinct labels (as strings)."""
        return sorted({ex.label for ex in self.examples if ex.label is not None})

    def _labels_described(self) -> list[str] | str:
        """The distinct labels, or for many numeric ones (regression scores) how many and their range."""
        labels = self.label_set()
        if len(labels) <= 20:
            return labels
        try:
            values = [float(v) for v in labels]
        except ValueError:
            return labels
        return f"{len(labels)} distinct numbers from {min(values):g} to {max(values):g}"

    def fingerprint(self, word_tags: bool = False) -> str:
        """SHA-256 of the examples' content: equal corpora give equal fingerprints.

        ``word_tags`` also hashes the UPOS/XPOS tags (a tagging run's targets; off by default so older
        fingerprints hold). A tag file's ``tags`` are always hashed.
        """
        digest = hashlib.sha256()
        for ex in self.examples:
            fields = [ex.text, ex.text_pair, ex.label, ex.words, ex.heads, ex.deprels]
            if ex.n_first_words is not None:  # only pairs annotated over both texts: older fingerprints hold
                fields.append(ex.n_first_words)
            if ex.tags is not None:
                fields.append(ex.tags)
            if word_tags:
                fields += [ex.upos, ex.xpos]
            digest.update(json.dumps(fields).encode())
        return digest.hexdigest()

    def subset(self, indices: Sequence[int], name: str | None = None) -> "Corpus":
        """A new corpus with the chosen examples, in the given order."""
        return Corpus([self.examples[i] for i in indices], name or self.name, self.source, dict(self.stats))

    def head(self, n: int | None) -> "Corpus":
        """The first ``n`` examples (all when ``n`` is None)."""
        if n is None or n >= len(self):
            return self
        out = self.subset(range(n))
        out.stats["limited_to"] = n
        return out

    def stratified_sample(self, n: int | None, seed: int) -> "Corpus":
        """A seeded, label-stratified sample of ``n`` examples kept in corpus order (all when ``n`` is None or large).

        Files are often sorted by label, so the first ``n`` rows can be a single class. Falls back to a
        plain seeded sample when a class is too small to stratify.
        """
        if n is None or n >= len(self):
            return self
        from sklearn.model_selection import train_test_split

        idx = list(range(len(self)))
        labels = [str(ex.label) for ex in self.examples]
        try:
            keep, _ = train_test_split(idx, train_size=n, random_state=seed, stratify=labels)
        except ValueError:
            keep, _ = train_test_split(idx, train_size=n, random_state=seed)
        out = self.subset(sorted(int(i) for i in keep))
        out.stats["sampled_to"] = n
        return out

    def describe(self) -> dict:
        """Provenance for manifest.json."""
        return {
            "name": self.name,
            "source": self.source,
            "n_examples": len(self),
            "pairs": self.has_pairs,
            "labels": self._labels_described() if self.has_labels else None,
            "sha256": self.fingerprint(),
            **self.stats,
        }

    @classmethod
    def from_list(
        cls,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        labels: Sequence[object] | None = None,
        name: str = "corpus",
    ) -> "Corpus":
        """Build a corpus from Python lists (labels are stored as strings)."""
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
        if labels is not None and len(labels) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
        examples = [
            Example(
                text=t,
                text_pair=None if pairs is None else pairs[i],
                label=None if labels is None else str(labels[i]),
            )
            for i, t in enumerate(texts)
        ]
        return cls(examples, name=name)


def source_name(data: "str | Corpus | None") -> str | None:
    """A manifest's record of a command's data: the path as given, or where a corpus held in memory came from."""
    return data.source if isinstance(data, Corpus) else data


def require_labels(corpus: Corpus, needs: str, where: str, lack: str = "no label") -> None:
    """Raise one clear error, naming the first unlabelled rows, when any example of ``corpus`` has no label.

    Ablation and fine-tuning both need every label; ``needs`` opens the message, ``where`` names the
    data and ``lack`` says what the rows lack, so each keeps its own wording.
    """
    missing = [i for i, ex in enumerate(corpus) if ex.label is None]
    if missing:
        shown = ", ".join(str(i) for i in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise BertologyError(
            f"{needs}, but {len(missing)} of {len(corpus)} examples in the {where} ({corpus.source}) "
            f"have {lack} (rows {shown}). Name the label column with --label-column."
        )
