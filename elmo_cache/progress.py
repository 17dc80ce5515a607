"""Progress of long phases on stderr: a tqdm bar on a terminal, whole lines in a log.

A bar redraws itself with carriage returns; a log (``2> build.log``, a scheduler's or a container's
output) keeps those as one ever-growing line. When the stream is not a terminal the same bar writes a
plain line instead, at most every ``ELMO_CACHE_PROGRESS_SECONDS`` seconds (default 30) and once when the
phase ends: what ``--file-friendly-logging`` did for allennlp.
"""

from __future__ import annotations

import math
import os
import sys
from typing import IO, Any

from elmo_cache.errors import InvalidParameterError

__all__ = ["PROGRESS_SECONDS_ENV", "LOG_SECONDS", "progress_bar"]

PROGRESS_SECONDS_ENV = "ELMO_CACHE_PROGRESS_SECONDS"
"""Environment variable: seconds between progress lines when stderr is not a terminal."""
LOG_SECONDS = 30.0
"""The default of :data:`PROGRESS_SECONDS_ENV`."""


class _Lines:
    """The stream a bar writes to when it is not a terminal: each redraw one line, no carriage return."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def _log_seconds() -> float:
    raw = os.environ.get(PROGRESS_SECONDS_ENV, "").strip()
    if not raw:
        return LOG_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidParameterError(f"{PROGRESS_SECONDS_ENV} is {raw!r}; it must be a number of seconds >= 0")
    return seconds


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_bar(
    *,
    desc: str,
    unit: str,
    total: float | None = None,
    initial: float = 0,
    disable: bool = False,
    stream: IO[str] | None = None,
    **options: Any,
) -> Any:
    """A tqdm bar for one phase on ``stream`` (default stderr): redrawn in place on a terminal; elsewhere
    one plain line at most every :data:`PROGRESS_SECONDS_ENV` seconds and a last one when it closes."""
    from tqdm import tqdm

    stream = sys.stderr if stream is None else stream
    common = {"total": total, "initial": initial, "desc": desc, "unit": unit, "disable": disable, **options}
    if _is_terminal(stream):
        return tqdm(file=stream, dynamic_ncols=True, **common)
    seconds = _log_seconds()
    return tqdm(file=_Lines(stream), mininterval=seconds, miniters=1, ascii=True, ncols=120, **common)
