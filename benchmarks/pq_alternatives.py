"""Which product quantisation meets issue 21's target (8x smaller than float16, perplexity within 5%)?

    python benchmarks/pq_alternatives.py --heldout /work/data/corpus/heldout.txt --train /work/data/corpus/train.txt \\
        --train-lines 6000 --train-vectors 65536 pq64 opq64

The bundled model encodes the first ``--eval-lines`` (1,000) held-out lines (as ``bench_quantize.py`` does)
and, separately, the first ``--train-lines`` lines of ``--train`` (text the vectors read back never saw);
each scheme is trained per layer on the first ``--train-vectors`` of the latter with faiss (seed 1234,
one thread) and applied to the former. Reported per scheme: bytes per vector (float16: 512), per-layer
max abs error, mean cosine and relative RMS against float32, and the held-out perplexity of layer 2's
halves through the bundled softmax (as ``bench_quantize.py`` computes it), against float32's.
``--in-sample`` trains on the evaluated vectors themselves instead (what a build of a corpus smaller than
its 65,536-row sample does). Schemes: ``pqM`` (faiss ProductQuantizer), ``opqM`` (OPQ rotation, then PQ),
``normpqM`` (a float16 norm, PQ on the unit direction), ``rqA+B`` (PQ A, then PQ B on the residual).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import faiss
import numpy as np
import torch

from elmo_cache import Encoder
from elmo_cache.model.hub import BUNDLED_DIR
from elmo_cache.train.files import load_trained_model
from elmo_cache.train.softmax import full_softmax_loss
from elmo_cache.train.vocab import BOS, EOS

SEED = 1234


def encode(path: Path, n_lines: int, encoder: Encoder) -> tuple[np.ndarray, list[list[str]]]:
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    tokens = [line.split() for line in lines if line][:n_lines]
    out = []
    with torch.inference_mode():
        for start in range(0, len(tokens), 64):
            flat, _ = encoder.encode_flat(tokens[start : start + 64])
            out.append(flat.numpy().copy())
    return np.concatenate(out, axis=1), tokens


def pq(m: int):
    def fit(train: np.ndarray, x: np.ndarray) -> np.ndarray:
        q = faiss.ProductQuantizer(train.shape[1], m, 8)
        q.cp.seed, q.cp.niter = SEED, 25
        q.train(np.ascontiguousarray(train))
        return q.decode(q.compute_codes(np.ascontiguousarray(x)))

    return fit, m


def opq(m: int, iterations: int = 10):
    def fit(train: np.ndarray, x: np.ndarray) -> np.ndarray:
        rotation = faiss.OPQMatrix(train.shape[1], m)
        rotation.niter = iterations
        rotation.train(np.ascontiguousarray(train))
        q = faiss.ProductQuantizer(train.shape[1], m, 8)
        q.cp.seed = SEED
        q.train(rotation.apply(np.ascontiguousarray(train)))
        return rotation.reverse_transform(q.decode(q.compute_codes(rotation.apply(np.ascontiguousarray(x)))))

    return fit, m


def normpq(m: int):
    def fit(train: np.ndarray, x: np.ndarray) -> np.ndarray:
        norm_t, norm_x = (np.linalg.norm(a, axis=1, keepdims=True) for a in (train, x))
        return pq(m)[0](train / norm_t, x / norm_x) * norm_x.astype(np.float16).astype(np.float32)

    return fit, m + 2


def rq(a: int, b: int):
    def fit(train: np.ndarray, x: np.ndarray) -> np.ndarray:
        first_t, first_x = pq(a)[0](train, train), pq(a)[0](train, x)
        return first_x + pq(b)[0](train - first_t, x - first_x)

    return fit, a + b


def scheme(name: str):
    if name.startswith("opq"):
        return opq(int(name[3:]))
    if name.startswith("normpq"):
        return normpq(int(name[6:]))
    if name.startswith("rq"):
        return rq(*(int(n) for n in name[2:].split("+")))
    return pq(int(name[2:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("schemes", nargs="+")
    parser.add_argument("--heldout", type=Path, required=True)
    parser.add_argument("--eval-lines", type=int, default=1000)
    parser.add_argument("--train", type=Path, required=True)
    parser.add_argument("--train-lines", type=int, default=6000)
    parser.add_argument("--train-vectors", type=int, default=65536)
    parser.add_argument("--in-sample", action="store_true")
    args = parser.parse_args()
    print(" ".join(sys.argv))
    faiss.omp_set_num_threads(1)
    encoder = Encoder.load("bundled", device="cpu")
    evaluated, tokens = encode(args.heldout, args.eval_lines, encoder)
    train = evaluated if args.in_sample else encode(args.train, args.train_lines, encoder)[0]
    train = train[:, : args.train_vectors]
    model, vocab = load_trained_model(BUNDLED_DIR)
    weight, bias = model.softmax_weight.detach(), model.softmax_bias.detach()
    half = weight.shape[1]
    forward, backward = [], []
    for sentence in tokens:
        ids = [vocab.id(t) for t in sentence]
        forward += [*ids[1:], vocab.id(EOS)]
        backward += [vocab.id(BOS), *ids[:-1]]

    def perplexity(top: np.ndarray) -> float:
        h = torch.from_numpy(np.ascontiguousarray(top))
        nll = [
            float(full_softmax_loss(h[:, :half], torch.tensor(forward), weight, bias).double().mean()),
            float(full_softmax_loss(h[:, half:], torch.tensor(backward), weight, bias).double().mean()),
        ]
        return math.exp(sum(nll) / 2)

    base = perplexity(evaluated[2])
    print(
        f"{evaluated.shape[1]:,} tokens evaluated, {train.shape[1]:,} training vectors a layer; float32 ppl {base:.3f}"
    )
    for name in args.schemes:
        fit, nbytes = scheme(name)
        begin = time.perf_counter()
        decoded, cells = [], []
        for layer in range(3):
            a = evaluated[layer]
            b = fit(train[layer], a)
            decoded.append(b)
            cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
            rel = np.sqrt(((a - b) ** 2).sum() / (a**2).sum())
            cells.append(f"L{layer} max {np.abs(a - b).max():.3f} cos {cos.mean():.5f} rrms {rel:.3f}")
        ppl = perplexity(decoded[2])
        print(
            f"{name:10s} {nbytes:3d} B/vector ({512 / nbytes:.1f}x)  ppl {ppl:.3f} ({100 * (ppl / base - 1):+.2f}%)  "
            + " | ".join(cells)
            + f"  {time.perf_counter() - begin:.0f} s"
        )


if __name__ == "__main__":
    main()
