#!/usr/bin/env bash
# Train En→De on Multi30k and score test_2016_flickr with beam search.
# Usage: scripts/train_multi30k.sh [RUN_DIR] [extra nmt train args, e.g. --set train.threads=1 --set train.max_time_s=3600]
# Data: $MULTI30K (default ../shared/data/multi30k beside the checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${MULTI30K:-../shared/data/multi30k}
RUN=${1:-runs/multi30k_en_de}
shift || true
nmt train -c configs/multi30k_en_de.yaml --set data.dir="$DATA" --run-dir "$RUN" "$@"
nmt evaluate --checkpoint "$RUN/best.pt" --src "$DATA/test_2016_flickr.en.gz" --ref "$DATA/test_2016_flickr.de.gz" \
  --output "$RUN/test_2016_flickr.hyp.de" --json | tee "$RUN/test_2016_flickr.json"
