#!/usr/bin/env bash
# Rebuild the bundled model from scratch: corpus from Debian packages, n-gram baselines,
# training (hours on 2 CPU cores; rerun this script after an interruption to resume), model card,
# then copy the files into the package. Needs apt sources (run `apt-get update` once).
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${WORK:-/work/data}
MODEL=${MODEL:-$WORK/bundled-model}
TRAIN=(elmo-cache train "$WORK/corpus/train.txt" -o "$MODEL" --preset base --epochs "${EPOCHS:-10}" --threads "${THREADS:-2}" --reset-share 0.5)

python scripts/bundled_model/build_corpus.py --out "$WORK/corpus" --work "$WORK/scratch"
"${TRAIN[@]}"
python scripts/bundled_model/ngram_baselines.py --train "$WORK/corpus/train.txt" \
    --heldout "$WORK/corpus/heldout.txt" --vocab "$MODEL/vocab.txt" --json "$WORK/baselines.json"
python scripts/bundled_model/make_model_card.py --model "$MODEL" --corpus "$WORK/corpus" \
    --baselines "$WORK/baselines.json" --command "${TRAIN[*]}" --out "$MODEL/MODEL_CARD.md"
for f in options.json weights.hdf5 vocab.txt softmax.hdf5 MODEL_CARD.md; do
    cp "$MODEL/$f" elmo_cache/model/bundled/"$f"
done
