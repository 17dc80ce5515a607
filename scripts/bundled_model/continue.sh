#!/usr/bin/env bash
# How the shipped bundled model was made from the first one (2026-11-25): training continued for the
# encoder's use (--reset-share 0.5, --init-from the first model) on the first model's own corpus split,
# so that its held-out text stays unseen. build_corpus.py's current split moved documents between
# train and held-out: the first model trained on most of the new held-out text, so only a model
# trained from scratch (rebuild.sh) can be measured on it.
#
# Steps: the first split (build_corpus.py as of commit 25e5e5f, same .deb files), its held-out text
# less the sentences that also occur in its training text, the n-gram baselines on that, the
# continued training (stopped by --time-limit; rerun the same command to go on), the model card.
# Needs apt sources (run `apt-get update` once) and the first model (git show 7a94116:... or a checkout).
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${WORK:-/work/data}
FIRST=${FIRST:-$WORK/bundled-first}   # options.json, weights.hdf5, softmax.hdf5, vocab.txt of the first model
MODEL=${MODEL:-$WORK/model-cont}
TRAIN=(elmo-cache train "$WORK/corpus-old/train.txt" -o "$MODEL" --init-from "$FIRST" --reset-share 0.5
    --epochs 3 --learning-rate 0.1 --threads "${THREADS:-1}" --time-limit "${MINUTES:-125}")

if [ ! -d "$FIRST" ]; then
    mkdir -p "$FIRST"
    for f in options.json weights.hdf5 softmax.hdf5 vocab.txt; do
        git show "7a94116:elmo_cache/model/bundled/$f" > "$FIRST/$f"
    done
fi
git show 25e5e5f:scripts/bundled_model/build_corpus.py > "$WORK/build_corpus_first.py"
python "$WORK/build_corpus_first.py" --out "$WORK/corpus-old" --work "$WORK/scratch"
python scripts/bundled_model/unseen_heldout.py --corpus "$WORK/corpus-old" --out "$WORK/corpus-eval"
python scripts/bundled_model/ngram_baselines.py --train "$WORK/corpus-eval/train.txt" \
    --heldout "$WORK/corpus-eval/heldout.txt" --vocab "$FIRST/vocab.txt" --json "$WORK/baselines-eval.json"
"${TRAIN[@]}"
python benchmarks/probe_quality.py --model "$MODEL" --wordnet "$WORK/scratch/extract/wordnet-base/usr/share/wordnet" \
    --probes wsd,pos --threads "${THREADS:-1}" --json "$WORK/probes.json"
python scripts/bundled_model/make_model_card.py --model "$MODEL" --corpus "$WORK/corpus-eval" --probes "$WORK/probes.json" \
    --baselines "$WORK/baselines-eval.json" --command "${TRAIN[*]}" --out "$MODEL/MODEL_CARD.md" \
    --split-note "$(cat scripts/bundled_model/first_split_note.txt)" \
    --history "$(cat scripts/bundled_model/first_stage_note.txt)"
for f in options.json weights.hdf5 vocab.txt softmax.hdf5 MODEL_CARD.md; do
    cp "$MODEL/$f" elmo_cache/model/bundled/"$f"
done
