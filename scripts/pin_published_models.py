"""Print the SHA-256 sums of AllenAI's published ELMo files, to pin them in elmo_cache/model/hub.py.

Run once on a machine with network access (the files total ~1.5 GB):

    python scripts/pin_published_models.py [--dir FOLDER]

and add the printed ``options_sha256=...``/``weights_sha256=...`` arguments to the matching
``PublishedModel(...)`` entries of ``PUBLISHED_MODELS``. Each file is downloaded unverified (this is
how the sums are first taken: compare them with a second download or another mirror before pinning).
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
from pathlib import Path

import pooch

from elmo_cache.model.hub import PUBLISHED_MODELS


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None, help="download folder (default: a temporary one)")
    args = parser.parse_args()
    folder = args.dir or Path(tempfile.mkdtemp(prefix="elmo-pin-"))
    for model in PUBLISHED_MODELS.values():
        sums = []
        for (url, _), kind in zip(model.files(), ("options", "weights"), strict=True):
            path = Path(pooch.retrieve(url, known_hash=None, path=folder / model.name, progressbar=True))
            sums.append(f'{kind}_sha256="{sha256(path)}"')
        print(f"{model.name}: " + ", ".join(sums))


if __name__ == "__main__":
    main()
