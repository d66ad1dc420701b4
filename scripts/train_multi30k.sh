#!/usr/bin/env bash
# The Multi30k En→De recipe: train, average the last step checkpoints, choose the checkpoint
# (best.pt or the average) and the length-penalty α on the validation set, then score both
# test sets once with that choice. Nothing before the last step reads a test file.
# Usage: scripts/train_multi30k.sh [RUN_DIR] [extra nmt train args, e.g. --set train.threads=2]
# Data: $MULTI30K (default ../shared/data/multi30k beside the checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${MULTI30K:-../shared/data/multi30k}
RUN=${1:-runs/multi30k_en_de}
shift || true
nmt train -c configs/multi30k_en_de.yaml --set data.dir="$DATA" --run-dir "$RUN" "$@"
nmt average --run-dir "$RUN" --last 5 -o "$RUN/average.pt"
for ckpt in best average; do
  nmt tune-decode --checkpoint "$RUN/$ckpt.pt" --src "$DATA/val.en.gz" --ref "$DATA/val.de.gz" \
    --beam-sizes 5 --length-normalizations length --length-penalties 1.0,1.5,2.0 --json > "$RUN/tune_$ckpt.json"
done
# The highest validation BLEU over both checkpoints and every α (ties: the first).
read -r CKPT ALPHA < <(python - "$RUN" <<'PY'
import json, sys
run = sys.argv[1]
rows = [(row["bleu"], name, row["length_penalty"]) for name in ("best", "average") for row in json.load(open(f"{run}/tune_{name}.json"))["rows"]]
bleu, name, alpha = max(rows, key=lambda r: r[0])
print(name, alpha)
PY
)
echo "chosen on val: $CKPT.pt, length normalisation 'length', α $ALPHA" | tee "$RUN/choice.txt"
for test in test_2016_flickr test_2017_flickr; do
  nmt evaluate --checkpoint "$RUN/$CKPT.pt" --src "$DATA/$test.en.gz" --ref "$DATA/$test.de.gz" \
    --beam-size 5 --length-normalization length --length-penalty "$ALPHA" \
    --output "$RUN/$test.hyp.de" --json | tee "$RUN/$test.json"
done
