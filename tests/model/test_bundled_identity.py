"""The bundled model is the trained one its card describes: the shipped weights have the SHA-256
the card prints, and on English it has never seen it predicts far better than chance."""

from __future__ import annotations

import re

from elmo_cache.model import hub
from elmo_cache.train.evaluate import perplexity

# Plain English written for this test (not from the training sources), one sentence per line.
HELD_OUT = """\
The weather was cold this morning , so we stayed inside and read the newspaper .
She opened the door and asked whether anyone had seen her keys .
After dinner the children played in the garden until it was dark .
He said that the meeting would start at nine o'clock on Monday .
The old man walked slowly down the road towards the village .
If you want to learn a language , you should practise every day .
They built a small house near the river and lived there for many years .
The book on the table belongs to my brother .
We could not find the answer to the question in any of the books .
It is important to know what the function returns when the list is empty .
"""


def test_the_shipped_weights_are_the_ones_the_card_names(bundled_model):
    card = (hub.BUNDLED_DIR / "MODEL_CARD.md").read_text(encoding="utf-8")
    match = re.search(r"`weights\.hdf5` SHA-256: `([0-9a-f]{64})`", card)
    assert match, "MODEL_CARD.md must state the SHA-256 of weights.hdf5"
    assert hub.file_sha256(bundled_model.weight_file) == match.group(1)


def test_the_bundled_model_is_trained(bundled_model, tmp_path):
    text = tmp_path / "held_out.txt"
    text.write_text(HELD_OUT, encoding="utf-8")
    result = perplexity(hub.BUNDLED_DIR, text, mode="sentence", device="cpu")
    vocabulary = sum(1 for _ in (hub.BUNDLED_DIR / "vocab.txt").open(encoding="utf-8"))
    # An untrained model is no better than a uniform guess over its vocabulary (56k words here);
    # the trained one is within a small factor of its card's held-out figure on this easy text.
    assert result.predictions > 100
    assert result.forward < 1000 and result.backward < 1000, result
    assert max(result.forward, result.backward) < vocabulary / 50, (result, vocabulary)
