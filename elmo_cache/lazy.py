"""Package names imported on first use (PEP 562), so that importing a package, ``--help`` and option errors
need none of the heavy modules (torch) its names come from.

    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

``_EXPORTS`` maps each public name to the module that defines it; a name, once imported, is kept in the
package's globals, so later lookups do not come back here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: dict[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose public names are the keys of ``exports``."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(namespace.get("__all__", exports))

    return __getattr__, __dir__
