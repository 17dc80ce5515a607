"""Which window of a long sentence each token's vector comes from: pure bookkeeping, no model.

A sentence is a run of tokens, token ``k`` spanning subwords ``[a_k, b_k)``. When all its subwords fit
one window (``window`` subwords, the model's positions less its special tokens) it is one window.
Otherwise windows are runs of whole tokens: the first starts at token 0 and holds as many tokens as
fit; each next one starts at the first token whose first subword lies at least ``stride`` subwords
after the previous window's first subword (but no later than the token after the previous window's
last, so that every token is in some window), until a window reaches the sentence's end. A token's
vector comes from the window where it has the most context: the largest ``min(subwords before it
in the window, subwords after it)``, the earliest such window on a tie. All of it depends on the
sentence alone, so it is the same in any batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from elmo_cache.errors import InvalidParameterError

__all__ = ["SentenceWindows", "plan_windows"]


@dataclass(frozen=True)
class SentenceWindows:
    """The windows of one sentence and the window each token is read from."""

    # Each window as a subword range [start, end) of the sentence.
    windows: tuple[tuple[int, int], ...]
    # For each token, the index of its window in ``windows``.
    chosen: tuple[int, ...]


def plan_windows(
    spans: Sequence[tuple[int, int]], window: int, stride: int, *, tokens: Sequence[str] = ()
) -> SentenceWindows:
    """The windows of a sentence whose tokens span ``spans`` (contiguous subword ranges, in order).

    ``tokens`` (the sentence's words) only name a token too long for any window in the error.
    """
    if not spans:
        return SentenceWindows((), ())
    total = spans[-1][1]
    if total <= window:
        return SentenceWindows(((0, total),), (0,) * len(spans))
    bounds: list[tuple[int, int]] = []  # token ranges [first, end) of each window
    first = 0
    while True:
        begin = spans[first][0]
        end = first
        while end < len(spans) and spans[end][1] - begin <= window:
            end += 1
        if end == first:
            word = tokens[first] if first < len(tokens) else f"token {first}"
            raise InvalidParameterError(
                f"token {first} ({word!r}) is {spans[first][1] - spans[first][0]} subwords long, more than the "
                f"{window} the model reads at once; it has no window to be encoded in"
            )
        bounds.append((first, end))
        if end == len(spans):
            break
        following = first + 1
        while following < end and spans[following][0] < begin + stride:
            following += 1
        first = following
    chosen = []
    for k, (a, b) in enumerate(spans):
        best, best_context = -1, -1
        for w, (first, end) in enumerate(bounds):
            if first <= k < end:
                context = min(a - spans[first][0], spans[end - 1][1] - b)
                if context > best_context:
                    best, best_context = w, context
        chosen.append(best)
    windows = tuple((spans[first][0], spans[end - 1][1]) for first, end in bounds)
    return SentenceWindows(windows, tuple(chosen))
