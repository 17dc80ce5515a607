"""The one registry of store formats: every :class:`~elmo_cache.store.container.Container` by name,
the built-in zarr and HDF5 containers registered on first use.
"""

from __future__ import annotations

import os
from pathlib import Path

from elmo_cache.errors import InvalidParameterError
from elmo_cache.store.container import Container

__all__ = ["register_container", "get_container", "container_names", "containers", "container_for_suffix"]


_REGISTRY: dict[str, Container] = {}


def _builtin() -> dict[str, Container]:
    if not _REGISTRY:
        from elmo_cache.store.hdf5.container import Hdf5Container
        from elmo_cache.store.zarr.container import ZarrContainer

        for container in (ZarrContainer(), Hdf5Container()):  # the first is the default format
            _REGISTRY[container.name] = container
    return _REGISTRY


def register_container(container: Container) -> None:
    """Add a container to the registry (after the built-in ones)."""
    if not isinstance(container, Container):
        raise TypeError(f"{container!r} does not implement the Container protocol")
    registry = _builtin()
    if container.name in registry:
        raise InvalidParameterError(f"a container named {container.name!r} is already registered")
    taken = {suffix for known in registry.values() for suffix in known.suffixes} & set(container.suffixes)
    if taken:
        raise InvalidParameterError(f"suffixes {sorted(taken)} already belong to another container")
    registry[container.name] = container


def containers() -> tuple[Container, ...]:
    """Every registered container, the default first."""
    return tuple(_builtin().values())


def container_names() -> tuple[str, ...]:
    """The valid ``--format`` values, the default first."""
    return tuple(_builtin())


def get_container(name: str) -> Container:
    """The container called ``name``; the error lists the valid ones."""
    try:
        return _builtin()[name]
    except KeyError:
        raise InvalidParameterError(f"format: {name!r} is not valid; choose from {list(container_names())}") from None


def container_for_suffix(path: str | os.PathLike[str]) -> Container | None:
    """The container a path's suffix asks for (``.zarr``, ``.h5``...), or None."""
    suffix = Path(path).suffix.lower()
    return next((c for c in containers() if suffix in c.suffixes), None)
