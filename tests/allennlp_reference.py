"""allennlp 2.10.1's own ``_ElmoBiLm``, loaded from its wheel, as a reference for the compat layer.

allennlp 2.10.1 cannot be installed beside torch 2.13 (it pins an old torch and pulls spaCy and
transformers), but the modules that compute ELMo need only torch, numpy and h5py. This helper reads
those source files straight out of the wheel and runs them unchanged: ``modules/elmo.py``,
``elmo_lstm.py``, ``lstm_cell_with_projection.py``, ``encoder_base.py``, ``highway.py``,
``scalar_mix.py``, ``nn/util.py``, ``common/checks.py`` and ``data/token_indexers/elmo_indexer.py``.
Only the imports that take no part in the computation are replaced by small stand-ins (the registry
decorators, ``cached_path`` on local files, the dataset classes that ``batch_to_ids`` and ``Elmo``
import, and ``block_orthogonal``: an initialiser whose values the weight file overwrites).

``.ci/run`` downloads the wheel (``pip download allennlp==2.10.1 --no-deps``) and sets
``ALLENNLP_2_10_1_WHEEL`` to its path; elsewhere set it the same way. Without it :func:`load_reference`
returns None and the tests skip (with it naming a missing file, they fail). Nothing
here is imported by the package; the loaded modules are removed from ``sys.modules`` afterwards so
a real allennlp, if one is ever installed, is left alone.
"""

from __future__ import annotations

import os
import sys
import types
import zipfile
from collections.abc import Iterable, Iterator
from functools import cache
from itertools import islice
from pathlib import Path
from typing import Any

import torch

WHEEL_ENV = "ALLENNLP_2_10_1_WHEEL"

# Real modules, in dependency order: each only imports stand-ins or modules loaded before it.
_REAL_MODULES = (
    "allennlp.common.checks",
    "allennlp.nn.util",
    "allennlp.data.token_indexers.elmo_indexer",
    "allennlp.modules.highway",
    "allennlp.modules.scalar_mix",
    "allennlp.modules.encoder_base",
    "allennlp.modules.lstm_cell_with_projection",
    "allennlp.modules.elmo_lstm",
    "allennlp.modules.elmo",
)


def _lazy_groups_of(iterable: Iterable[Any], group_size: int) -> Iterator[list[Any]]:
    iterator = iter(iterable)
    while group := list(islice(iterator, group_size)):
        yield group


class _Registrable:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    @classmethod
    def register(cls, *args: Any, **kwargs: Any) -> Any:
        return lambda subclass: subclass


class _Placeholder:
    """Stands in for a data class that only ``batch_to_ids`` and ``Elmo`` use (not called here)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("not part of the reference: build character ids with char_ids()")


def _stand_ins() -> dict[str, dict[str, Any]]:
    def int_to_device(device: Any) -> torch.device:
        if isinstance(device, torch.device):
            return device
        return torch.device("cpu") if device < 0 else torch.device(device)

    def is_distributed() -> bool:
        return torch.distributed.is_available() and torch.distributed.is_initialized()

    def pad_sequence_to_length(sequence: Any, desired_length: int, default_value: Any = lambda: 0, **_: Any) -> list:
        padded = list(sequence)[:desired_length]
        return padded + [default_value() for _ in range(desired_length - len(padded))]

    return {
        "allennlp": {},
        "allennlp.common": {"FromParams": object},
        "allennlp.common.file_utils": {"cached_path": lambda path, **_: str(path)},
        "allennlp.common.util": {
            "lazy_groups_of": _lazy_groups_of,
            "int_to_device": int_to_device,
            "is_distributed": is_distributed,
            "is_global_primary": lambda: True,
            "pad_sequence_to_length": pad_sequence_to_length,
        },
        "allennlp.nn": {},
        # Only reset_parameters calls it; load_weights then overwrites every weight it touched.
        "allennlp.nn.initializers": {"block_orthogonal": lambda tensor, split_sizes, gain=1.0: None},
        "allennlp.data": {},
        "allennlp.data.instance": {"Instance": _Placeholder},
        "allennlp.data.tokenizers": {"Token": _Placeholder},
        "allennlp.data.tokenizers.token_class": {"Token": _Placeholder},
        "allennlp.data.vocabulary": {"Vocabulary": _Placeholder},
        "allennlp.data.batch": {"Batch": _Placeholder},
        "allennlp.data.fields": {"TextField": _Placeholder},
        "allennlp.data.token_indexers": {},
        "allennlp.data.token_indexers.token_indexer": {"TokenIndexer": _Registrable, "IndexedTokenList": dict},
        "allennlp.modules": {},
    }


@cache
def load_reference() -> types.SimpleNamespace | None:
    """The real ``allennlp.modules.elmo`` and ``allennlp.nn.util`` of 2.10.1, or None without the wheel."""
    wheel = os.environ.get(WHEEL_ENV)
    if not wheel or not Path(wheel).is_file():
        return None
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "allennlp"}
    loaded: dict[str, types.ModuleType] = {}
    try:
        for name, namespace in _stand_ins().items():
            module = types.ModuleType(name)
            module.__path__ = []  # every stand-in may act as a package
            module.__dict__.update(namespace)
            sys.modules[name] = loaded[name] = module
        with zipfile.ZipFile(wheel) as archive:
            for name in _REAL_MODULES:
                path = name.replace(".", "/") + ".py"
                module = types.ModuleType(name)
                module.__file__ = f"{wheel}/{path}"
                sys.modules[name] = loaded[name] = module
                exec(compile(archive.read(path), module.__file__, "exec"), module.__dict__)
                parent, _, child = name.rpartition(".")
                setattr(loaded[parent], child, module)
        return types.SimpleNamespace(
            elmo=loaded["allennlp.modules.elmo"],
            util=loaded["allennlp.nn.util"],
            mapper=loaded["allennlp.data.token_indexers.elmo_indexer"].ELMoCharacterMapper(),
        )
    finally:
        for name in loaded:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def char_ids(reference: types.SimpleNamespace, batch: list[list[str]]) -> torch.Tensor:
    """``batch_to_ids`` without allennlp's dataset classes: the real character mapper, padded with
    zero rows (what its ``TextField`` padding writes)."""
    longest = max((len(sentence) for sentence in batch), default=0)
    ids = torch.zeros(len(batch), longest, 50, dtype=torch.long)
    for row, sentence in enumerate(batch):
        for position, token in enumerate(sentence):
            ids[row, position] = torch.tensor(reference.mapper.convert_word_to_char_ids(token))
    return ids


def reference_embeddings(
    reference: types.SimpleNamespace, bilm: torch.nn.Module, batch: list[list[str]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """What allennlp 0.9's ``ElmoEmbedder.batch_to_embeddings`` computes, with 2.10.1's modules:
    activations ``(batch, 3, n_tokens, dim)`` without ``<S>``/``</S>``, and the mask."""
    with torch.no_grad():
        output = bilm(char_ids(reference, batch))
        stripped = [reference.util.remove_sentence_boundaries(layer, output["mask"]) for layer in output["activations"]]
    return torch.stack([layer for layer, _ in stripped], dim=1), stripped[0][1]
