"""``verify``: a cache checked against docs/FORMAT.md (``checks``), its pooled vectors (``pooled``)
and a sample of its vectors against a fresh encoding (``sample``)."""

from elmo_cache.verify.checks import verify
from elmo_cache.verify.report import VerifyReport

__all__ = ["VerifyReport", "verify"]
