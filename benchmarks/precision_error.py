"""Error of bf16 and fp16 encodings against fp32, on the bilm-tf test model (trained weights).

    python benchmarks/precision_error.py [--device cpu|cuda]

Prints, per precision and layer, the max and mean absolute error and the min/mean cosine
similarity per token over the 30 test sentences, plus the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np
import torch

from elmo_cache import Encoder

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "data" / "bilm_tf_golden"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    options, weights = GOLDEN / "options.json", GOLDEN / "lm_weights.hdf5"
    sentences = [s.split() for batch in json.loads((GOLDEN / "sentences.json").read_text()) for s in batch]
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, device {args.device}")
    print(f"{len(sentences)} sentences, {sum(map(len, sentences))} tokens")
    # Reduced precision is measured for its error here, whatever its speed on this CPU.
    os.environ.setdefault("ELMO_CACHE_ALLOW_SLOW_BF16", "1")
    os.environ.setdefault("ELMO_CACHE_ALLOW_SLOW_FP16", "1")
    reference = Encoder.load((options, weights), device=args.device).embed_batch(sentences)
    for precision in ("bf16", "fp16"):
        encoded = Encoder.load((options, weights), device=args.device, precision=precision).embed_batch(sentences)
        for layer in range(3):
            a = np.concatenate([e[layer] for e in encoded])
            b = np.concatenate([r[layer] for r in reference])
            cosine = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
            print(
                f"{precision} layer {layer}: max abs {np.abs(a - b).max():.2e}  mean abs {np.abs(a - b).mean():.2e}  "
                f"min cos {cosine.min():.6f}  mean cos {cosine.mean():.6f}"
            )


if __name__ == "__main__":
    main()
