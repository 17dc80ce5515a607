"""What ``verify`` found: the checks passed, the problems, and what could not be checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["VerifyReport"]


@dataclass
class VerifyReport:
    """Outcome of :func:`verify`: ``ok`` when ``problems`` is empty."""

    path: Path
    checks: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    corpus: str | None = None
    sampled: int = 0
    max_abs_error: float | None = None
    # What could not be checked (a format-1 cache: no checksums, no stored text).
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        lines = [f"{self.path}: " + ("OK" if self.ok else f"{len(self.problems)} problem(s)")]
        lines += [f"  ok: {c}" for c in self.checks]
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        lines += [f"  ({n})" for n in self.notes]
        return "\n".join(lines)
