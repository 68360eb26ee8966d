"""SQuAD questions -> model inputs: question + context windows with a document stride, and span targets.

A context longer than the room ``max_length`` leaves after the question and the special tokens is cut
into overlapping windows by the fast tokenizer (``truncation="only_second"``,
``return_overflowing_tokens``, ``stride``): ``doc_stride`` is the number of context tokens two
consecutive windows share (Hugging Face's meaning; BERT's original script counted the step instead).
Each window is one :class:`QAFeature`. Its target is the token span of the question's first answer
when that span lies wholly inside the window, else the [CLS] position (also for an unanswerable
question), as in BERT's ``run_squad.py`` and Hugging Face's ``run_qa.py``. The character offsets of the
context tokens are kept so that a predicted token span becomes a span of the context.

Token-level offsets need a fast (Rust) tokenizer; a slow one is refused with one clear error.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from transformers import PreTrainedTokenizerBase

from bertology.data.encode import EncodedCorpus, EncodedExample
from bertology.data.squad import SquadData
from bertology.errors import BertologyError

#: The longest answer a predicted span may have, in tokens (BERT's and Hugging Face's default).
MAX_ANSWER_LENGTH = 30
#: Context tokens shared by consecutive windows (Hugging Face's ``run_qa.py`` default).
DOC_STRIDE = 128


@dataclass
class QAFeature(EncodedExample):
    """One window of one question: the encoded pair plus what span scoring needs.

    ``index`` is the feature's own position (targets are per feature); ``question`` the question's
    position in the :class:`~bertology.data.squad.SquadData`. ``offsets[t]`` is token ``t``'s
    ``[start, end)`` character span in the context, ``(-1, -1)`` for question and special tokens.
    ``start``/``end`` are the target token positions (``cls_index`` when the answer is not in the window).
    """

    question: int = 0
    offsets: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), dtype=np.int64))
    start: int = 0
    end: int = 0
    cls_index: int = 0
    max_answer_length: int = MAX_ANSWER_LENGTH


@dataclass
class QAFeatures(EncodedCorpus):
    """Every window of every question, with the data and the span-decoding settings they were made with.

    ``null_threshold``: a question is answered "no answer" when the best null score (start and end
    logits at [CLS], the smallest over its windows) exceeds the best span's score by more than this
    (BERT's ``null_score_diff_threshold``); only when ``with_negative`` (SQuAD v2.0 data).
    """

    data: SquadData = field(default_factory=lambda: SquadData([]))
    doc_stride: int = DOC_STRIDE
    max_answer_length: int = MAX_ANSWER_LENGTH
    null_threshold: float = 0.0
    with_negative: bool = False
    #: questions whose windows overlap by less than ``doc_stride`` (capped at half their context room)
    n_strides_capped: int = 0

    @property
    def groups(self) -> np.ndarray:
        """The question position of every feature (item order)."""
        return np.array([it.question for it in self.items], dtype=np.int64)

    def describe(self) -> dict:
        per_question = np.bincount(self.groups, minlength=len(self.data))
        answerable = [it for it in self.items if not self.data[it.question].is_impossible]
        return {
            "max_length": self.max_length, "doc_stride": self.doc_stride, "doc_stride_meaning": "context tokens shared by consecutive windows, at most half a window's context",
            "n_questions_with_a_capped_stride": self.n_strides_capped,
            "max_answer_length": self.max_answer_length, "null_threshold": self.null_threshold if self.with_negative else None,
            "no_answer_allowed": self.with_negative, "n_input": self.n_input, "n_questions": len(self.data),
            "n_kept": len(self.items), "n_features": len(self.items), "n_questions_over_several_windows": int((per_question > 1).sum()),
            "n_answerable_windows_without_the_answer": sum(it.start == it.cls_index for it in answerable),
            "n_skipped_overlong": 0, "n_truncated": 0, "n_tokens": self.n_tokens,
        }


def _token_span(offsets: np.ndarray, context: np.ndarray, start_char: int, end_char: int) -> tuple[int, int] | None:
    """The first and last context tokens covering ``[start_char, end_char)``; None when the window lacks part of it."""
    ctx = np.flatnonzero(context)
    first, last = ctx[0], ctx[-1]
    if offsets[first, 0] > start_char or offsets[last, 1] < end_char:
        return None
    s = first
    while s <= last and offsets[s, 0] <= start_char:
        s += 1
    e = last
    while e >= first and offsets[e, 1] >= end_char:
        e -= 1
    return int(s - 1), int(e + 1)


def window_stride(doc_stride: int, room: int) -> int:
    """The overlap of consecutive windows: ``--doc-stride``, capped at half the tokens a window leaves for the
    context (``room``), so that every window moves forward by at least half of it. Uncapped at SQuAD's usual
    384 / 128; at bertology's default --max-length 128 the cap is what lets a window hold any new context."""
    return min(doc_stride, room // 2)


def encode_squad(
    data: SquadData,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int = 384,
    doc_stride: int = DOC_STRIDE,
    *,
    max_answer_length: int = MAX_ANSWER_LENGTH,
    null_threshold: float = 0.0,
) -> QAFeatures:
    """Tokenise every question with its context into windows (see the module docstring)."""
    if not getattr(tokenizer, "is_fast", False):
        raise BertologyError(
            f"Question answering needs a fast tokenizer (character offsets of every token); {type(tokenizer).__name__} "
            "is a slow one. Save the model with its tokenizer.json, or load a fast tokenizer for it."
        )
    if getattr(tokenizer, "padding_side", "right") != "right":
        raise BertologyError("Question answering puts the question first; a tokenizer that pads on the left is not supported.")
    if len(data) == 0:
        raise BertologyError(f"The SQuAD data {data.name!r} ({data.source}) has no questions.")
    if doc_stride < 0 or max_answer_length < 1:
        raise BertologyError(f"--doc-stride must be >= 0 and --max-answer-length >= 1 (got {doc_stride}, {max_answer_length}).")
    model_max = getattr(tokenizer, "model_max_length", None) or max_length
    max_length = int(min(max_length, model_max))
    n_special = tokenizer.num_special_tokens_to_add(pair=True)
    out = QAFeatures([], max_length, "truncate", len(data), data=data, doc_stride=doc_stride,
                     max_answer_length=max_answer_length, null_threshold=null_threshold, with_negative=data.with_negative)
    for q, ex in enumerate(data):
        n_question = len(tokenizer(ex.question, add_special_tokens=False)["input_ids"])
        room = max_length - n_question - n_special
        if room < 2:
            raise BertologyError(
                f"{data.source}: question {ex.id!r} takes {n_question} tokens, leaving {room} of --max-length {max_length} "
                "for the context; raise --max-length (384 is usual for SQuAD)."
            )
        stride = window_stride(doc_stride, room)
        if stride < doc_stride:
            out.n_strides_capped += 1
        enc = tokenizer(
            ex.question, ex.context, truncation="only_second", max_length=max_length, stride=stride,
            return_overflowing_tokens=True, return_offsets_mapping=True, return_token_type_ids=True,
        )
        for w in range(len(enc["input_ids"])):
            ids = np.asarray(enc["input_ids"][w], dtype=np.int64)
            seq = enc.sequence_ids(w)
            context = np.array([s == 1 for s in seq])
            special = np.array([s is None for s in seq])
            offsets = np.asarray(enc["offset_mapping"][w], dtype=np.int64).reshape(-1, 2)
            offsets[~context] = -1
            cls_hits = np.flatnonzero(ids == tokenizer.cls_token_id) if tokenizer.cls_token_id is not None else []
            cls_index = int(cls_hits[0]) if len(cls_hits) else 0
            span = None
            if ex.answers:
                text, start = ex.answers[0]
                span = _token_span(offsets, context, start, start + len(text)) if context.any() else None
            s, e = span if span is not None else (cls_index, cls_index)
            out.items.append(QAFeature(
                index=len(out.items), input_ids=ids,
                token_type_ids=np.asarray(enc["token_type_ids"][w], dtype=np.int64),
                special=special, word_ids=np.full(len(ids), -1, dtype=np.int64),
                segment=np.where(special, -1, np.where(context, 1, 0)).astype(np.int64),
                question=q, offsets=offsets, start=s, end=e, cls_index=cls_index, max_answer_length=max_answer_length,
            ))
    return out
