"""Read a CoNLL-U treebank: one example per sentence with its words, UPOS/XPOS tags, heads and relations.

Every malformed line is one :class:`~bertology.errors.BertologyError` naming the file and the line
(the ``conllu`` library names none, so a sentence it refuses is re-parsed line by line to find it).
Multi-word tokens and empty nodes are counted and left out; a sentence whose words all lack a HEAD is
read without a tree, one with only some heads is refused. :func:`bertology.data.loaders.load_corpus`
reads ``.conllu`` files through :func:`read_conllu`.
"""
from __future__ import annotations

import io
from pathlib import Path

from bertology.data.corpus import Example
from bertology.errors import BertologyError


def _conllu_error(path: Path, lineno: int, msg: str) -> BertologyError:
    return BertologyError(f"{path}, line {lineno}: malformed CoNLL-U: {msg}")


def _check_conllu_line(path: Path, lineno: int, line: str):
    """Validate one token line (10 tab-separated fields, ID, HEAD); return (id, head)."""
    from conllu.exceptions import ParseException
    from conllu.parser import parse_id_value, parse_int_value

    fields = line.split("\t")
    if len(fields) != 10:
        raise _conllu_error(path, lineno, f"expected 10 tab-separated fields, found {len(fields)}")
    try:
        tid = parse_id_value(fields[0])
    except ParseException:
        raise _conllu_error(
            path, lineno, f"ID {fields[0]!r} is not a word index (1), a range (1-2) or an empty node (1.1)"
        ) from None
    if not isinstance(tid, int):
        return tid, None
    try:
        head = parse_int_value(fields[6])
    except ParseException:
        raise _conllu_error(path, lineno, f"HEAD {fields[6]!r} is not an integer") from None
    if head is not None and head < 0:
        raise _conllu_error(path, lineno, f"HEAD {head} is negative")
    return tid, head


def _locate_conllu_error(path: Path, block: list[tuple[int, str]], err: Exception) -> BertologyError:
    """The conllu library names no line: re-parse the sentence line by line to find it."""
    from conllu.exceptions import ParseException
    from conllu.parser import DEFAULT_FIELD_PARSERS, DEFAULT_FIELDS, parse_comment_line, parse_line

    for lineno, line in block:
        try:
            if line.startswith("#"):
                parse_comment_line(line)
            else:
                parse_line(line, DEFAULT_FIELDS, dict(DEFAULT_FIELD_PARSERS))
        except ParseException as line_err:
            return _conllu_error(path, lineno, str(line_err))
    return _conllu_error(path, block[0][0], f"in the sentence starting on this line: {err}")


def read_conllu(path: Path, text: str) -> tuple[list[Example], dict]:
    import conllu
    from conllu.exceptions import ParseException

    stats: dict = {
        "format": "conllu",
        "columns": {"text": "# text", "pair": None, "label": None},
        "n_sentences": 0,
        "n_multiword_tokens": 0,
        "n_empty_nodes": 0,
        "n_without_heads": 0,
    }
    examples: list[Example] = []
    block: list[tuple[int, str]] = []

    def flush():
        if not block:
            return
        words_lines = []
        for lineno, line in block:
            if line.startswith("#"):
                continue
            tid, head = _check_conllu_line(path, lineno, line)
            if isinstance(tid, int):
                words_lines.append((lineno, tid, head))
        try:
            sent = conllu.parse_token_and_metadata("\n".join(line for _, line in block))
        except ParseException as err:
            raise _locate_conllu_error(path, block, err) from None
        block.clear()
        if not words_lines:
            return
        n = len(words_lines)
        for k, (lineno, tid, head) in enumerate(words_lines, 1):
            if tid != k:
                raise _conllu_error(path, lineno, f"word ID {tid} out of sequence (expected {k})")
            if head is not None and head > n:
                raise _conllu_error(path, lineno, f"HEAD {head} points past the last word ({n})")
        n_missing = sum(head is None for _, _, head in words_lines)
        if 0 < n_missing < n:
            lineno = next(ln for ln, _, head in words_lines if head is None)
            raise _conllu_error(path, lineno, "HEAD is '_' while other words of this sentence have heads")
        tokens = [t for t in sent if isinstance(t["id"], int)]
        stats["n_multiword_tokens"] += sum(isinstance(t["id"], tuple) and t["id"][1] == "-" for t in sent)
        stats["n_empty_nodes"] += sum(isinstance(t["id"], tuple) and t["id"][1] == "." for t in sent)
        words = tuple(t["form"] for t in tokens)
        upos = tuple(t["upos"] for t in tokens)
        xpos = tuple(t["xpos"] or "_" for t in tokens)
        deprels = tuple(t["deprel"] for t in tokens)
        heads = None if n_missing else tuple(int(t["head"]) for t in tokens)
        if heads is None:
            stats["n_without_heads"] += 1
        sentence = (sent.metadata.get("text") or "").strip() or " ".join(words)
        examples.append(
            Example(
                text=sentence,
                words=words,
                upos=None if all(u == "_" for u in upos) else upos,
                xpos=None if all(x == "_" for x in xpos) else xpos,
                heads=heads,
                deprels=None if heads is None or all(d == "_" for d in deprels) else deprels,
            )
        )

    for lineno, raw in enumerate(io.StringIO(text, newline=None), 1):
        line = raw.rstrip("\n")
        if not line.strip():
            flush()
        else:
            block.append((lineno, line))
    flush()
    stats["n_sentences"] = len(examples)
    return examples, stats
