"""A Transformer encoder's word-aligned layers: elmo-cache's encoder against a plain transformers loop.

    python benchmarks/bench_transformer.py                          # 'mini' model, 20,000 tokens, CPU
    python benchmarks/bench_transformer.py --size base --tokens 200000 --device cuda

Both sides compute the same thing, every layer (embeddings + each block) of every token of the same
sentences, one vector per stored token from its first subword:

* **ours**: ``Encoder.load("hf:DIR").embed_sentences`` (sentences sorted by length into sub-batches of
  ``--batch-tokens`` tokens, padded only to the longest of each, the attention kernel transformers picks);
* **loop**: what one writes by hand: the sentences in corpus order, 32 at a time, through the tokenizer
  (``is_split_into_words``, ``padding=True``, truncation at the model's positions) and the model with
  ``output_hidden_states``, then each word's first subword picked through ``word_ids``;
* **pipeline**: transformers' ``pipeline("feature-extraction", batch_size=32)`` on the joined text, for
  reference: it returns the last layer per subword only, no word alignment, so it does less than the others.

It prints tokens per second of each (median of ``--repeats``, alternating), the speed-up, the largest
difference between ours and the loop, the machine and the load average (the machine may be shared).

The model is random (speed does not depend on the weights' values) with a WordPiece tokenizer trained on
the synthetic corpus (``_corpus.make_corpus``), built once into ``~/.cache/elmo-cache-bench/`` (or
``$ELMO_CACHE_BENCH_DIR``): no hub access.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _corpus import corpus_stats, make_corpus
from _machine import describe_machine, synchronize

# (hidden, blocks, heads, intermediate): mini is BERT-mini's shape, small BERT-small's, base BERT-base's.
SIZES = {"mini": (256, 4, 4, 1024), "small": (512, 4, 8, 2048), "base": (768, 12, 12, 3072)}


def model_dir(size: str, corpus: list[list[str]]) -> Path:
    """A random BERT-shaped model of ``size`` with a WordPiece tokenizer, saved once."""
    root = Path(os.environ.get("ELMO_CACHE_BENCH_DIR", Path.home() / ".cache" / "elmo-cache-bench"))
    directory = root / f"bert-{size}"
    if (directory / "config.json").is_file():
        return directory
    from elmo_cache.model.random_transformer import wordpiece_tokenizer, write_random_bert

    # A vocabulary smaller than the corpus's, so that rarer words split into pieces as in real text.
    tokenizer = wordpiece_tokenizer((" ".join(s) for s in corpus), 8000, lowercase=False)
    hidden, blocks, heads, inner = SIZES[size]
    return write_random_bert(
        directory, tokenizer, hidden=hidden, blocks=blocks, heads=heads, intermediate=inner, positions=512
    )


def run_ours(encoder, corpus, batch_tokens):
    out = []
    for vectors in encoder.embed_sentences(corpus, batch_tokens=batch_tokens):
        out.append(vectors)
    return out


def run_loop(model, tokenizer, corpus, device, batch=32):
    """The hand-written loop: corpus order, 32 sentences padded to the longest, first subword per word."""
    out = []
    with torch.inference_mode():
        for start in range(0, len(corpus), batch):
            chunk = corpus[start : start + batch]
            encoded = tokenizer(
                chunk, is_split_into_words=True, padding=True, truncation=True, max_length=512, return_tensors="pt"
            )
            hidden = model(**encoded.to(device), output_hidden_states=True).hidden_states
            stacked = torch.stack(hidden, dim=1).float().cpu().numpy()  # (batch, layers, positions, dim)
            for row in range(len(chunk)):
                firsts, seen = [], set()
                for position, word in enumerate(encoded.word_ids(row)):
                    if word is not None and word not in seen:
                        seen.add(word)
                        firsts.append(position)
                out.append(stacked[row][:, firsts])
    return out


def run_pipeline(extractor, corpus):
    return extractor([" ".join(s) for s in corpus], batch_size=32, truncation=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=list(SIZES), default="mini")
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-tokens", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--no-pipeline", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModel, AutoTokenizer, pipeline

    from elmo_cache import Encoder

    corpus = [s for s in make_corpus(args.tokens, seed=0) if len(s) <= 120]
    n_tokens = sum(len(s) for s in corpus)
    directory = model_dir(args.size, corpus)
    device = torch.device(args.device)
    encoder = Encoder.load(f"hf:{directory}", device=device)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory).to(device).eval()
    extractor = (
        None if args.no_pipeline else pipeline("feature-extraction", model=model, tokenizer=tokenizer, device=device)
    )
    print(
        f"model    random BERT-{args.size} {SIZES[args.size]}, {encoder.n_layers} layers, attention "
        f"{model.config._attn_implementation}; window {encoder.window} subwords"
    )
    print(f"corpus   {corpus_stats(corpus).line()}")
    print(f"load     before {[round(x, 2) for x in os.getloadavg()]}")

    # Warm-up (and the check that both compute the same vectors) on a slice.
    sample = corpus[:64]
    ours_sample, loop_sample = run_ours(encoder, sample, args.batch_tokens), run_loop(model, tokenizer, sample, device)
    worst = max(float(np.abs(a - b).max()) for a, b in zip(ours_sample, loop_sample, strict=True) if a.size)
    if extractor is not None:
        run_pipeline(extractor, sample)

    times: dict[str, list[float]] = {"ours": [], "loop": [], "pipeline": []}
    for _ in range(args.repeats):
        for name in ("ours", "loop", "pipeline"):
            if name == "pipeline" and extractor is None:
                continue
            synchronize(device)
            began = time.perf_counter()
            if name == "ours":
                run_ours(encoder, corpus, args.batch_tokens)
            elif name == "loop":
                run_loop(model, tokenizer, corpus, device)
            else:
                run_pipeline(extractor, corpus)
            synchronize(device)
            times[name].append(time.perf_counter() - began)
    rate = {name: n_tokens / statistics.median(t) for name, t in times.items() if t}
    for name, tokens_per_s in rate.items():
        print(f"{name:8s} {tokens_per_s:10,.0f} tokens/s  (runs: {', '.join(f'{t:.2f}s' for t in times[name])})")
    print(
        f"speed-up ours / loop: {rate['ours'] / rate['loop']:.2f}x"
        + (f"; ours / pipeline (last layer only): {rate['ours'] / rate['pipeline']:.2f}x" if "pipeline" in rate else "")
    )
    print(f"max |ours - loop| on {len(sample)} sentences: {worst:.2e}")
    print(f"load     after {[round(x, 2) for x in os.getloadavg()]}")
    for line in describe_machine(device).lines():
        print(line)


if __name__ == "__main__":
    main()
