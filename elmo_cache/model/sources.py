"""Where a model comes from: one registry of model sources, asked in order.

A user names a model in one of a few ways (nothing, ``"bundled"``, a published name, a
directory, or an options file with a weight file); a cache records the model that built it
(its metadata's ``model``). Each way is a :class:`ModelSource`: it says which requests it
claims, turns a claimed request into :class:`ModelFiles` (downloading if it must), and proposes
the local files of a recorded model without downloading. :func:`resolve` and :func:`locate` ask
the registered sources in order; :meth:`elmo_cache.Encoder.load` is built on :func:`resolve`.

Adding a source (another model format, another hub) is one class with the three methods of
:class:`ModelSource` and one :func:`register_source` call; nothing else branches on sources.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from elmo_cache.errors import InvalidParameterError, ModelNotFoundError
from elmo_cache.model import hub
from elmo_cache.model import transformer as _transformer
from elmo_cache.model.files import ModelFiles

__all__ = [
    "ModelRequest",
    "ModelSource",
    "ModelSpec",
    "register_source",
    "registered_sources",
    "resolve",
    "locate",
]

_log = logging.getLogger("elmo_cache.model")

ModelSpec = str | os.PathLike[str] | tuple[str | os.PathLike[str], str | os.PathLike[str]] | ModelFiles | None
"""What :meth:`Encoder.load <elmo_cache.Encoder.load>` takes: a name, a directory, an
``(options_file, weight_file)`` pair, files already resolved, or None (the bundled model)."""


@dataclass(frozen=True)
class ModelRequest:
    """A user's request for a model, before any source has looked at it."""

    # A name or a directory (None: nothing named).
    model: str | None = None
    # An options.json named directly (goes with weight_file).
    options_file: Path | None = None
    # A weights HDF5 named directly (goes with options_file).
    weight_file: Path | None = None

    @classmethod
    def of(
        cls,
        model: ModelSpec = None,
        options_file: str | os.PathLike[str] | None = None,
        weight_file: str | os.PathLike[str] | None = None,
    ) -> ModelRequest:
        """The request behind :data:`ModelSpec` plus explicit files (which win over ``model``)."""
        if (options_file is None) != (weight_file is None):
            raise InvalidParameterError("options_file and weight_file go together: give both, or use model")
        if isinstance(model, tuple):
            if len(model) != 2 or options_file is not None:
                raise InvalidParameterError(
                    "a model given as a tuple is (options_file, weight_file); do not also pass options_file"
                )
            options_file, weight_file = model
            model = None
        if isinstance(model, ModelFiles):
            raise InvalidParameterError("ModelFiles are already resolved: load them, do not resolve them")
        return cls(
            model=None if model is None else str(model),
            options_file=None if options_file is None else Path(options_file),
            weight_file=None if weight_file is None else Path(weight_file),
        )


@runtime_checkable
class ModelSource(Protocol):
    """One way to name a model. Implementations must not download in :meth:`candidate`."""

    # Recorded as ModelFiles.origin by what this source resolves.
    origin: str

    def claims(self, request: ModelRequest) -> bool:
        """Whether this source answers ``request`` (the first source that claims it resolves it)."""
        ...

    def resolve(self, request: ModelRequest) -> ModelFiles:
        """The files of a claimed request; raises :class:`ModelNotFoundError` (or a download error)."""
        ...

    def candidate(self, recorded: Mapping[str, Any]) -> tuple[ModelFiles | None, str]:
        """Local files that may hold the model a cache records (checked by the caller), else
        ``(None, why)``; ``why`` is empty when this source has nothing to say about that model."""
        ...

    def describe(self) -> str:
        """The names this source accepts, for error messages."""
        ...


def _bundled_files() -> ModelFiles:
    options, weights = hub.BUNDLED_DIR / "options.json", hub.BUNDLED_DIR / "weights.hdf5"
    missing = [p.name for p in (options, weights) if not p.is_file()]
    if missing:
        raise ModelNotFoundError(
            f"the bundled model is incomplete: {missing} missing from {hub.BUNDLED_DIR}; reinstall elmo-cache, "
            f"or name another model with --model (one of {list(hub.PUBLISHED_MODELS)} or a directory)"
        )
    return ModelFiles(hub.BUNDLED, options, weights, "bundled")


_announced: list[str] = []


def _announce_default(files: ModelFiles) -> None:
    """Say once per process which model loads when none was named: allennlp's tools loaded the Original
    (1024-d) in that case, so code ported from them would otherwise change model without a word."""
    if _announced:
        return
    from elmo_cache.model.options import ModelOptions

    dim = ModelOptions.from_file(files.options_file).output_dim
    _announced.append(files.name)
    _log.warning(
        "no model named: loading elmo-cache's bundled model %r (3 layers of %d-d vectors, a small English model "
        "shipped with the package), not allennlp's default, the Original ELMo (1024-d); for that pass "
        "--model original (Python: model='original', or your options and weight files)",
        files.name,
        dim,
    )


def _find_in_directory(directory: Path) -> tuple[Path, Path]:
    options = sorted(directory.glob("*options*.json"))
    weights = sorted(directory.glob("*weights*.hdf5")) or sorted(directory.glob("*weights*.h5"))
    if len(options) != 1 or len(weights) != 1:
        found = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
        raise ModelNotFoundError(
            f"{directory}: expected exactly one '*options*.json' and one '*weights*.hdf5', found {found or 'nothing'}; "
            "pass --options-file and --weight-file to choose"
        )
    return options[0], weights[0]


class FilesSource:
    """An options file and a weight file named directly (they win over a model name)."""

    origin = "files"

    def claims(self, request: ModelRequest) -> bool:
        return request.options_file is not None

    def resolve(self, request: ModelRequest) -> ModelFiles:
        assert request.options_file is not None and request.weight_file is not None
        return ModelFiles(request.weight_file.stem, request.options_file, request.weight_file, self.origin)

    def candidate(self, recorded: Mapping[str, Any]) -> tuple[ModelFiles | None, str]:
        return None, ""  # loose files leave no trace a cache could follow back

    def describe(self) -> str:
        return "--options-file F --weight-file F"


class BundledSource:
    """The model shipped inside the package: no name, or ``"bundled"``; needs no network."""

    origin = "bundled"

    def claims(self, request: ModelRequest) -> bool:
        return request.model is None or request.model.lower() == hub.BUNDLED

    def resolve(self, request: ModelRequest) -> ModelFiles:
        files = _bundled_files()
        if request.model is None:
            _announce_default(files)
        return files

    def candidate(self, recorded: Mapping[str, Any]) -> tuple[ModelFiles | None, str]:
        try:
            return _bundled_files(), "it is not the bundled model"
        except ModelNotFoundError:
            return None, "the bundled model's files are missing"

    def describe(self) -> str:
        return repr(hub.BUNDLED)


class PublishedSource:
    """The models AllenAI published, by short name; downloaded once into :func:`hub.models_dir`."""

    origin = "published"

    def claims(self, request: ModelRequest) -> bool:
        return request.model is not None and request.model.lower() in hub.PUBLISHED_MODELS

    def resolve(self, request: ModelRequest) -> ModelFiles:
        assert request.model is not None
        published = hub.PUBLISHED_MODELS[request.model.lower()]
        options, weights = hub.download(published)
        return ModelFiles(published.name, options, weights, self.origin)

    def candidate(self, recorded: Mapping[str, Any]) -> tuple[ModelFiles | None, str]:
        name = str(recorded.get("name")).lower()
        published = hub.PUBLISHED_MODELS.get(name)
        if published is None:
            return None, ""
        options, weights = hub.local_paths(published)
        if options.is_file() and weights.is_file():
            return ModelFiles(published.name, options, weights, self.origin), f"{weights} holds other weights"
        return None, f"{name!r} is not downloaded into {options.parent}"

    def describe(self) -> str:
        return ", ".join(repr(name) for name in hub.PUBLISHED_MODELS)


class EfmlPublishedSource:
    """The ELMoForManyLangs models HIT-SCIR published, by ``efml-<lang>`` name (:mod:`.efml_hub`);
    each archive downloaded once and unpacked into ``hub.models_dir()/efml-<lang>/``."""

    origin = "elmoformanylangs-published"

    @staticmethod
    def _files(name: str, directory: Path) -> ModelFiles:
        from elmo_cache.model import efml

        return ModelFiles(
            name,
            directory / efml.CONFIG_FILE,
            directory / "encoder.pkl",
            EfmlPublishedSource.origin,
            directory=directory,
            format=efml.FORMAT,
        )

    def claims(self, request: ModelRequest) -> bool:
        from elmo_cache.model import efml_hub

        return request.model is not None and request.model.lower() in efml_hub.EFML_MODELS

    def resolve(self, request: ModelRequest) -> ModelFiles:
        from elmo_cache.model import efml_hub

        assert request.model is not None
        published = efml_hub.EFML_MODELS[request.model.lower()]
        return self._files(published.name, efml_hub.download(published))

    def candidate(self, recorded: Mapping[str, Any]) -> tuple[ModelFiles | None, str]:
        from elmo_cache.model import efml_hub

        name = str(recorded.get("name")).lower()
        published = efml_hub.EFML_MODELS.get(name)
        if published is None:
            return None, ""
        folder = efml_hub.local_dir(published)
        found = efml_hub.find_model_dir(folder)
        if found is None:
            return None, f"{name!r} is not downloaded into {folder}"
        return self._files(published.name, found), f"{found} holds another {name!r} model"

    def describe(self) -> str:
        from elmo_cache.model import efml_hub

        codes = ", ".join(name.removeprefix(efml_hub.PREFIX) for name in efml_hub.EFML_MODELS)
        return f"'{efml_hub.PREFIX}LANG' (ELMoForManyLangs; LANG one of {codes})"


class DirectorySource:
    """A local directory holding one ``*options*.json`` and one ``*weights*.hdf5``."""

    origin = "directory"

    def claims(self, request: ModelRequest) -> bool:
        return request.model is not None and Path(request.model).expanduser().is_dir()

    def resolve(self, request: ModelRequest) -> ModelFiles:
        assert request.model is not None
        path = Path(request.model).expanduser()
        options, weights = _find_in_directory(path)
        return ModelFiles(path.name, options, weights, self.origin, directory=path.resolve())

    def candidate(self, recorded: Mapping[str, Any]) -> tuple[ModelFiles | None, str]:
        directory = recorded.get("directory")
        if not isinstance(directory, str):
            return None, ""
        path = Path(directory)
        try:
            options, weights = _find_in_directory(path)
        except ModelNotFoundError:
            return None, f"its directory {directory} no longer holds a model"
        return ModelFiles(path.name, options, weights, self.origin, directory=path), (
            f"its directory {directory} now holds other weights"
        )

    def describe(self) -> str:
        return "a directory"


class EfmlSource:
    """A local ELMoForManyLangs (HIT-SCIR) model directory: ``config.json``, the model config it names,
    ``char.dic``, ``word.dic``, ``token_embedder.pkl``, ``encoder.pkl`` (:mod:`elmo_cache.model.efml`)."""

    origin = "elmoformanylangs"

    def files(self, path: Path) -> ModelFiles:
        """The files of the ELMoForManyLangs model directory ``path``."""
        # The source's origin is also the format's name (elmo_cache.model.formats.EFML).
        return ModelFiles(
            path.name, path / "config.json", path / "encoder.pkl", self.origin, directory=path, format=self.origin
        )

    def claims(self, request: ModelRequest) -> bool:
        from elmo_cache.model import efml

        return request.model is not None and efml.is_model_dir(Path(request.model).expanduser())

    def resolve(self, request: ModelRequest) -> ModelFiles:
        assert request.model is not None
        return self.files(Path(request.model).expanduser().resolve())

    def candidate(self, recorded: Mapping[str, Any]) -> tuple[ModelFiles | None, str]:
        from elmo_cache.model import efml

        directory, options = recorded.get("directory"), recorded.get("options")
        if not isinstance(directory, str) or not isinstance(options, dict) or options.get("format") != efml.FORMAT:
            return None, ""
        path = Path(directory)
        if not efml.is_model_dir(path):
            return None, f"its directory {directory} no longer holds an ELMoForManyLangs model"
        return self.files(path), f"its directory {directory} now holds another ELMoForManyLangs model"

    def describe(self) -> str:
        return "an ELMoForManyLangs model directory"


class NlplSource:
    """An NLPL / simple_elmo model (:mod:`elmo_cache.model.nlpl`): a directory of ``options.json`` and
    ``model.hdf5``, or its ``.zip`` as the NLPL repository distributes it (unpacked once, safely, into the
    model cache; an archive holding an ELMoForManyLangs directory loads as one)."""

    origin = "nlpl"

    def claims(self, request: ModelRequest) -> bool:
        from elmo_cache.model import nlpl

        if request.model is None:
            return False
        path = Path(request.model).expanduser()
        return nlpl.is_archive(path) or (path.is_dir() and nlpl.is_model_dir(path))

    def resolve(self, request: ModelRequest) -> ModelFiles:
        from elmo_cache.model import efml, nlpl

        assert request.model is not None
        path = Path(request.model).expanduser()
        if nlpl.is_archive(path):
            directory, name = nlpl.unpacked(path), path.stem
            if efml.is_model_dir(directory):
                return EfmlSource().files(directory)
        else:
            directory, name = path.resolve(), path.name
        options, weights = nlpl.model_files(directory)
        return ModelFiles(name, options, weights, self.origin, directory=directory)

    def candidate(self, recorded: Mapping[str, Any]) -> tuple[ModelFiles | None, str]:
        from elmo_cache.model import nlpl

        directory = recorded.get("directory")
        if not isinstance(directory, str) or not nlpl.is_model_dir(Path(directory)):
            return None, ""
        path = Path(directory)
        options, weights = nlpl.model_files(path)
        files = ModelFiles(str(recorded.get("name") or path.name), options, weights, self.origin, directory=path)
        return files, f"its directory {directory} now holds another NLPL model"

    def describe(self) -> str:
        return "an NLPL / simple_elmo directory (options.json + model.hdf5) or its .zip"


_SOURCES: list[ModelSource] = [
    FilesSource(),
    BundledSource(),
    PublishedSource(),
    EfmlPublishedSource(),
    EfmlSource(),
    NlplSource(),
    _transformer.TransformerSource(),
    DirectorySource(),
]


def register_source(source: ModelSource, *, before: str | None = None) -> None:
    """Add a model source; it is asked before the source whose ``origin`` is ``before``, else last."""
    if not isinstance(source, ModelSource):
        raise TypeError(f"{source!r} does not implement ModelSource (origin, claims, resolve, candidate, describe)")
    if any(existing.origin == source.origin for existing in _SOURCES):
        raise InvalidParameterError(f"a model source with origin {source.origin!r} is already registered")
    origins = [existing.origin for existing in _SOURCES]
    if before is not None and before not in origins:
        raise InvalidParameterError(f"before: {before!r} is not one of {origins}")
    _SOURCES.insert(origins.index(before) if before is not None else len(_SOURCES), source)


def registered_sources() -> tuple[ModelSource, ...]:
    """The model sources in the order they are asked."""
    return tuple(_SOURCES)


def resolve(
    model: ModelSpec = None,
    options_file: str | os.PathLike[str] | None = None,
    weight_file: str | os.PathLike[str] | None = None,
) -> ModelFiles:
    """The files of the model a user names: ``options_file`` + ``weight_file`` (both or neither; they
    win over ``model``), else ``model`` (None or "bundled", a published name, a directory, an
    ``(options_file, weight_file)`` pair). Published models are downloaded once and read from there after."""
    if isinstance(model, ModelFiles) and options_file is None and weight_file is None:
        return model
    request = ModelRequest.of(model, options_file, weight_file)
    for source in _SOURCES:
        if source.claims(request):
            return source.resolve(request)
    raise ModelNotFoundError(
        f"unknown model {request.model!r}: not one of " + "; ".join(source.describe() for source in _SOURCES)
    )


def _matches(candidate: ModelFiles, recorded: Mapping[str, Any]) -> bool:
    from elmo_cache.model import formats

    try:
        sha, options = formats.fingerprint(candidate)
    except (ModelNotFoundError, ValueError):
        return False
    return sha == recorded.get("weights_sha256") and options == recorded.get("options")


def locate(recorded: Mapping[str, Any]) -> tuple[ModelFiles | None, str]:
    """The local files of the model a cache records (its metadata's ``model``), without downloading.

    Returns ``(files, "")`` when a source has them here with the recorded weights SHA-256 and
    options (the bundled model, a published one already downloaded, the directory it was loaded
    from); otherwise ``(None, why)``.
    """
    sha = recorded.get("weights_sha256")
    name = str(recorded.get("name"))
    if not isinstance(sha, str):
        return None, "the cache does not record its model's weights SHA-256"
    tried = []
    for source in _SOURCES:
        files, why = source.candidate(recorded)
        if files is not None and _matches(files, recorded):
            return files, ""
        if why:
            tried.append(why)
    return None, (
        f"the model that built the cache ({name!r}, weights sha256 {sha[:12]}...) is not available locally: "
        + "; ".join(tried)
    )
