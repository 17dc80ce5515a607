"""Print the SHA-256 sums of the published ELMo files, to pin them in elmo_cache/model/.

Run once on a machine with network access:

    python scripts/pin_published_models.py [--dir FOLDER] [NAME|allennlp|efml ...]

Without names it takes AllenAI's models (``allennlp``: four options/weights pairs, ~1.5 GB); ``efml``
takes every ELMoForManyLangs archive (45 of a few hundred MB each), and names pick models one by
one (``small``, ``efml-de``). Add the printed ``options_sha256=...``/``weights_sha256=...`` arguments
to the matching ``PublishedModel(...)`` entries of ``PUBLISHED_MODELS`` (elmo_cache/model/hub.py),
and the ``"efml-LANG": "..."`` lines to ``_SHA256`` in elmo_cache/model/efml_hub.py. Each file is
downloaded unverified (this is how the sums are first taken: compare them with a second download or
another mirror before pinning).
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
from pathlib import Path

import pooch

from elmo_cache.model.efml_hub import EFML_MODELS
from elmo_cache.model.hub import PUBLISHED_MODELS


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def chosen(names: list[str]) -> list[str]:
    """The model names the arguments stand for, in catalogue order."""
    wanted: set[str] = set()
    for name in names or ["allennlp"]:
        if name == "allennlp":
            wanted.update(PUBLISHED_MODELS)
        elif name == "efml":
            wanted.update(EFML_MODELS)
        elif name in PUBLISHED_MODELS or name in EFML_MODELS:
            wanted.add(name)
        else:
            raise SystemExit(f"unknown model {name!r}: allennlp, efml, or one of {[*PUBLISHED_MODELS, *EFML_MODELS]}")
    return [name for name in (*PUBLISHED_MODELS, *EFML_MODELS) if name in wanted]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None, help="download folder (default: a temporary one)")
    parser.add_argument("names", nargs="*", help="allennlp (default), efml, or model names")
    args = parser.parse_args()
    folder = args.dir or Path(tempfile.mkdtemp(prefix="elmo-pin-"))
    for name in chosen(args.names):
        if name in PUBLISHED_MODELS:
            model = PUBLISHED_MODELS[name]
            sums = []
            for (url, _), kind in zip(model.files(), ("options", "weights"), strict=True):
                path = Path(pooch.retrieve(url, known_hash=None, path=folder / name, progressbar=True))
                sums.append(f'{kind}_sha256="{sha256(path)}"')
            print(f"{name}: " + ", ".join(sums))
        else:
            archive = EFML_MODELS[name]
            try:
                path = Path(pooch.retrieve(archive.url, known_hash=None, path=folder / name, progressbar=True))
            except Exception as exc:  # one unreachable archive (efml-zh's host) must not stop the others
                print(f"# {name}: not downloaded ({type(exc).__name__}: {exc})")
                continue
            print(f'"{name}": "{sha256(path)}",')


if __name__ == "__main__":
    main()
