#!/usr/bin/env python3
"""Write MODEL_CARD.md for a trained model directory from the facts on disk.

Reads the corpus manifest (sources, licences, counts), the n-gram baselines
(``ngram_baselines.py --json``), the training checkpoint (steps, tokens, time) and
measures the biLM's held-out perplexity itself, so every figure in the card comes
from the same files that ship.

    python scripts/bundled_model/make_model_card.py --model MODEL_DIR --corpus CORPUS_DIR \
        --baselines baselines.json --command "elmo-cache train ..." --out MODEL_DIR/MODEL_CARD.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from elmo_cache.model.hub import file_sha256
from elmo_cache.model.options import ModelOptions
from elmo_cache.train import perplexity
from elmo_cache.train.checkpoint import CHECKPOINT_FILE
from elmo_cache.train.files import WEIGHTS_FILE


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--corpus", required=True, type=Path, help="folder with manifest.json and heldout.txt")
    ap.add_argument("--baselines", required=True, type=Path)
    ap.add_argument("--command", required=True, help="the training command, as run")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument(
        "--split-note",
        default=None,
        help="how the held-out text was chosen, when not by build_corpus.py's current rule (replaces that sentence)",
    )
    ap.add_argument(
        "--probes",
        type=Path,
        default=None,
        help="the --json output of benchmarks/probe_quality.py --probes wsd,pos on this model (adds a section)",
    )
    ap.add_argument(
        "--history",
        action="append",
        default=[],
        help="an earlier stage of the training (e.g. the run --init-from started from); repeatable, in order",
    )
    args = ap.parse_args(argv)

    manifest = json.loads((args.corpus / "manifest.json").read_text())
    baselines = json.loads(args.baselines.read_text())
    checkpoint = torch.load(args.model / CHECKPOINT_FILE, map_location="cpu", weights_only=True)
    options = ModelOptions.from_file(args.model / "options.json")
    heldout = args.corpus / "heldout.txt"
    stream = perplexity(args.model, heldout, mode="stream")
    alone = perplexity(args.model, heldout, mode="sentence")
    warm = perplexity(args.model, heldout, mode="warm")
    if stream.predictions != baselines["heldout"]["predictions"]:
        print(
            f"warning: {stream.predictions} predictions vs {baselines['heldout']['predictions']} for the baselines",
            file=sys.stderr,
        )
    n_params = sum(int(t.numel()) for name, t in checkpoint["model"].items() if not name.startswith("softmax"))
    n_softmax = sum(int(t.numel()) for name, t in checkpoint["model"].items() if name.startswith("softmax"))
    fixed = checkpoint["fingerprint"]
    hours = checkpoint["seconds"] / 3600
    totals_train = sum(s["train"]["tokens"] for s in manifest["sources"])
    epochs = checkpoint["tokens"] / totals_train
    models = baselines["models"]
    trigram = models["kn_trigram"]["perplexity"]

    lines = [
        "# The bundled elmo-cache model",
        "",
        "A small ELMo biLM (Peters et al. 2018 architecture) trained by `elmo-cache train` on about "
        f"{totals_train / 1e6:.1f}M tokens of freely licensed English, so that elmo-cache works on a machine "
        "with no network. It is far smaller and weaker than the published ELMo models (`--model original` "
        "etc.): use it to try the tool, for tests, and where a download is impossible.",
        "",
        "## Model",
        "",
        f"- {options.n_layers}-layer biLSTM, {options.lstm_dim} cells, projection {options.projection_dim}, "
        f"char-CNN filters {[list(f) for f in options.filters]} ({options.n_filters} total), "
        f"{options.n_highway} highway layer, cell/projection clip {options.cell_clip}/{options.proj_clip}, "
        "skip connection from the second layer.",
        f"- Vectors: {options.n_layers + 1} layers x {options.output_dim} dimensions per token.",
        f"- {n_params:,} parameters in `weights.hdf5` (bilm-tf layout, float32); "
        f"{n_softmax:,} more in `softmax.hdf5` (vocabulary {fixed['min_count']}+ occurrences: "
        f"{baselines['vocab_size']:,} words incl. `<S>`, `</S>`, `<UNK>`).",
        f"- `weights.hdf5` SHA-256: `{file_sha256(args.model / WEIGHTS_FILE)}`.",
        "",
        "## Data",
        "",
        "Debian packages (downloaded with `apt-get download`, text extracted by "
        "`scripts/bundled_model/build_corpus.py`); no GPL text. "
        + (
            args.split_note
            or "Whole documents (a chapter, a page, a block of entries) go to the held-out split in an order set "
            "by a hash of their id, until they hold 1% of their source's tokens, so every source has held-out "
            "text. "
            + _dropped_note(manifest)
        ),
        "",
        "| source | package (version) | licence | train tokens | held-out tokens |",
        "|---|---|---|---|---|",
    ]
    for s in manifest["sources"]:
        lines.append(
            f"| {s['source']} | {s['package']} ({s['version']}) | {s['licence']} | "
            f"{s['train']['tokens']:,} | {s['heldout']['tokens']:,} |"
        )
    lines += [
        f"| **total** | | | **{totals_train:,}** | **{sum(s['heldout']['tokens'] for s in manifest['sources']):,}** |",
        "",
        "The sha256 of every .deb is in the corpus manifest the script writes. The fortune files (BSD per "
        "Debian) quote many authors; the novels, the Bible translation, the Jargon File and the Devil's "
        "Dictionary are public domain; WordNet, the Python and PostgreSQL manuals are under permissive licences.",
        "",
        "## Held-out perplexity",
        "",
        f"{alone.sentences:,} held-out sentences, {alone.tokens:,} tokens, OOV {alone.oov_rate:.2%}; each "
        f"sentence of n tokens is n + 1 predictions (its tokens and the sentence end), {stream.predictions:,} "
        "in all, for every model below; same vocabulary for all.",
        "",
        "First the fair comparison: the biLM as the encoder runs it (every sentence alone, from the zero "
        "state: `build` and `serve` by default), each direction against an n-gram model that also sees only "
        "the sentence.",
        "",
        "| model | forward | backward | mean | mean / KN trigram |",
        "|---|---|---|---|---|",
        _row("this biLM, each sentence from the zero state (the encoder's default)", alone, trigram),
        _row("this biLM, each sentence from the warm state (`--initial-state warm`)", warm, trigram),
        f"| Kneser-Ney trigram (interpolated, modified) | {trigram:.1f} | {trigram:.1f} | {trigram:.1f} | 1.00 |",
        f"| Kneser-Ney bigram (interpolated, modified) | {models['kn_bigram']['perplexity']:.1f} | | | |",
        f"| unigram (add-one) | {models['unigram']['perplexity']:.1f} | | | |",
        _row("this biLM, state carried across the sentences of a document (as bilm-tf trains)", stream, trigram),
        "",
        "The last row is not a like-for-like comparison: there the biLM reads the previous sentences of the "
        "document (32 rows, each starting at a sentence start), which the n-gram models never see and the "
        "encoder does not use. Reproduce: `elmo-cache perplexity MODEL_DIR heldout.txt --mode "
        "sentence|warm|stream` and `scripts/bundled_model/ngram_baselines.py`.",
        "",
        *(_probe_lines(json.loads(args.probes.read_text())) if args.probes else []),
        "## Training",
        "",
        f"- Command: `{args.command}`",
        f"- bilm-tf recipe: batch {fixed['batch_size']} x unroll {fixed['unroll']}, sampled softmax with "
        f"{fixed['num_sampled']} log-uniform negatives, dropout {fixed['dropout']}, Adagrad lr "
        f"{fixed['learning_rate']} (initial accumulator {fixed['initial_accumulator']}), gradient-norm clip "
        f"{fixed['clip_norm']}, seed {fixed['seed']}.",
        *(f"- Before this run: {stage}" for stage in args.history),
        _reset_note(fixed.get("reset_share")),
        f"- {'This run: ' if args.history else ''}{checkpoint['step']:,} steps, "
        f"{checkpoint['tokens']:,} tokens per direction "
        f"({epochs:.2f} epochs), {hours:.1f} hours on {_machine(checkpoint.get('machine'))}.",
        "",
        ("How this model was made, step by step: `scripts/bundled_model/continue.sh`. " if args.history else "")
        + "Rebuild everything from scratch (corpus, baselines, model, this card): `scripts/bundled_model/rebuild.sh`.",
        "",
    ]
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print(
        f"wrote {args.out}: held-out perplexity forward/backward/mean {alone.forward:.1f}/{alone.backward:.1f}/"
        f"{alone.mean:.1f} (zero state), {warm.mean:.1f} (warm), {stream.mean:.1f} (carried); KN trigram {trigram:.1f}"
    )
    return 0


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def _probe_lines(probes: dict) -> list[str]:
    """The word-sense and noun-vs-verb tables of ``probe_quality.py --json``, with their caveat."""
    wsd, pos = probes["wsd"], probes["pos"]
    layers = ("0", "1", "2")
    lines = [
        "## Probes",
        "",
        f"`python {' '.join(probes['argv'])}` ({probes['machine'].get('cpu', '')}); "
        "accuracy %, per layer, against a random-weights model of the same shape. The examples are WordNet's, "
        "whose glosses are ~1.6M of the 6.6M training tokens: the model has read these sentences (never their "
        "sense or part-of-speech labels), so a model that has not may score lower.",
        "",
        f"Word sense by 1-nearest-neighbour over sense means (the ELMo paper's WSD probe; {_wsd_counts(probes)}):",
        "",
        "| vectors | layer 0 | layer 1 | layer 2 |",
        "|---|---|---|---|",
        "| this model | " + " | ".join(_pct(wsd["model"][k]) for k in layers) + " |",
        "| random model | " + " | ".join(_pct(wsd["random"][k]) for k in layers) + " |",
        f"| most frequent training sense | {_pct(wsd['mfs'])} | | |",
        "",
        "Noun or verb, by a linear probe (split by example, and by lemma so that memorising the word cannot score):",
        "",
        "| split | vectors | layer 0 | layer 1 | layer 2 |",
        "|---|---|---|---|---|",
    ]
    for split, label in (("by_example", "by example"), ("by_lemma", "by lemma")):
        part = pos[split]
        lines += [
            f"| {label} ({part['n_train']:,} / {part['n_test']:,}) | this model | "
            + " | ".join(_pct(part["model"][k]) for k in layers)
            + " |",
            "| | random model | " + " | ".join(_pct(part["random"][k]) for k in layers) + " |",
            f"| | majority class | {_pct(part['majority'])} | | |",
        ]
    best_random = max(wsd["random"][k] for k in ("1", "2"))
    best_model = max(wsd["model"][k] for k in ("1", "2"))
    verdict = "no better than the random model's" if best_model <= best_random + 0.05 else "above the random model's"
    lines += [
        "",
        f"On senses the contextual layers beat layer 0 and the most frequent sense, but they are {verdict} "
        "(WordNet has one or two examples per sense, so a sense mean is about one sentence and the probe mostly "
        "rewards shared neighbouring words, which random LSTM features keep too). On noun against verb the "
        "contextual layers are far above the random model's, by lemma as by example.",
        "",
    ]
    return lines


def _wsd_counts(probes: dict) -> str:
    counts = probes.get("wsd_counts") or {}
    parts = [f"{counts[k]:,} {k.replace('_', ' ')}" for k in ("train", "test") if isinstance(counts.get(k), int)]
    return ", ".join(parts) or "WordNet examples"


def _row(label: str, result, trigram: float) -> str:
    return (
        f"| {label} | {result.forward:.1f} | {result.backward:.1f} | **{result.mean:.1f}** | "
        f"{result.mean / trigram:.2f} |"
    )


def _dropped_note(manifest: dict) -> str:
    dropped = manifest.get("totals", {}).get("heldout_dropped_as_seen")
    if not dropped:
        return ""
    return (
        f"{dropped['sentences']:,} held-out sentences that also occur in the training text (compared lower-cased, "
        "punctuation ignored) were dropped from the held-out text, so it measures modelling, not memory."
    )


def _reset_note(share: float | None) -> str:
    if share is None:
        return "- LSTM state carried through the whole stream (bilm-tf); rows may begin mid-sentence."
    return (
        f"- Trained for the encoder's use (`--reset-share {share}`): every row begins at a sentence start and "
        f"{share:.0%} of the sentences start from the zero state, the rest carry the state of the text before them."
    )


def _machine(recorded: dict | None) -> str:
    if not recorded:  # checkpoints before the trainer recorded its machine
        return "an unrecorded machine"
    threads = f"{recorded['threads']} thread{'s' if recorded['threads'] != 1 else ''}"
    return f"{threads} of {recorded['cpu']} ({recorded['device']}, torch {torch.__version__})"


if __name__ == "__main__":
    sys.exit(main())
