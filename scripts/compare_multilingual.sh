#!/usr/bin/env bash
# One model for several Multi30k directions against bilingual models of the same total steps,
# and the zero-shot de→fr direction against pivoting through English with the same model.
#
#   scripts/compare_multilingual.sh OUT STEPS [extra nmt train args]
#
# Trains (each run: the Multi30k recipe's config, its warm-up scaled to the run's length at the recipe's peak rate, 1 thread,
# one validation at the end on the first 300 `val` sentences):
#   OUT/multi   data.directions [en-de, en-fr, de-en], 3 × STEPS steps
#   OUT/en-de   en→de alone, STEPS steps
#   OUT/en-fr   en→fr alone, STEPS steps
# so each direction of the multilingual model has, on average, the steps a bilingual model has.
# The two bilingual runs go one after the other beside the multilingual one (one core each).
# Then scores test_2016_flickr once per model and direction (beam 5, the config's α), and
# de→fr both zero-shot (>>fr<< on German sources) and pivoted (de→en, then en→fr), and prints
# one JSON line per score. Data: $MULTI30K (default ../shared/data/multi30k).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/compare_multilingual.sh OUT STEPS [nmt train args]}
STEPS=${2:?usage: scripts/compare_multilingual.sh OUT STEPS [nmt train args]}
shift 2
DATA=${MULTI30K:-../shared/data/multi30k}
TEST=test_2016_flickr
export OMP_NUM_THREADS=1
common=(--set data.dir="$DATA" --set train.threads=1 --set train.save_every=0 --set data.valid_max_sentences=300 "$@")
run() {  # run DIR STEPS CONFIG [--set ...]
  local dir=$1 steps=$2 config=$3
  shift 3
  # The warm-up is the recipe's share of the run (600 of 2,600 steps) and lr_scale keeps the recipe's peak (0.5 at
  # warm-up 600: 1.28e-3; the noam peak falls as warm-up^-0.5), so that every run's schedule has one shape.
  local warmup=$((steps * 600 / 2600))
  nmt train -c "$config" --run-dir "$dir" --set train.max_steps="$steps" --set train.validate_every="$steps" \
    --set train.warmup_steps=$warmup --set train.lr_scale="$(python -c "print(round(0.5 * ($warmup / 600) ** 0.5, 4))")" \
    "${common[@]}" "$@" > "$dir.log" 2>&1
}
mkdir -p "$OUT"
run "$OUT/multi" $((3 * STEPS)) configs/multi30k_multi.yaml --set 'data.directions=[en-de, en-fr, de-en]' &
multi=$!
run "$OUT/en-de" "$STEPS" configs/multi30k_en_de.yaml
run "$OUT/en-fr" "$STEPS" configs/multi30k_en_de.yaml --set data.tgt_lang=fr
wait $multi

score() {  # score NAME CHECKPOINT SRC_LANG TGT_LANG [SRC_FILE]
  local name=$1 ckpt=$2 src=$3 tgt=$4 file=${5:-$DATA/$TEST.$3.gz}
  nmt evaluate --checkpoint "$ckpt" --tgt-lang "$tgt" --src "$file" --ref "$DATA/$TEST.$tgt.gz" --json --quiet \
    | python -c "import json, sys; r = json.load(sys.stdin); print(json.dumps({'model': '$name', 'direction': '$src-$tgt', 'bleu': r['bleu'], 'chrf': r['chrf'], 'signature': r['bleu_signature']}))"
}
score bilingual "$OUT/en-de/best.pt" en de
score bilingual "$OUT/en-fr/best.pt" en fr
score multilingual "$OUT/multi/best.pt" en de
score multilingual "$OUT/multi/best.pt" en fr
score multilingual "$OUT/multi/best.pt" de en
score "multilingual zero-shot" "$OUT/multi/best.pt" de fr
nmt translate --checkpoint "$OUT/multi/best.pt" --tgt-lang en -i "$DATA/$TEST.de.gz" -o "$OUT/pivot.en" --quiet
score "multilingual pivot (de→en→fr)" "$OUT/multi/best.pt" de fr "$OUT/pivot.en"
