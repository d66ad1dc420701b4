#!/usr/bin/env bash
# The Multi30k En→De recipe (scripts/train_recipe.sh says each step): train, average the last
# 5 step checkpoints, choose the checkpoint (best.pt or the average) and the length-penalty α
# on val, then score test_2016_flickr and test_2017_flickr once with that choice.
# Usage: scripts/train_multi30k.sh [RUN_DIR] [extra nmt train args, e.g. --set train.threads=2]
# Data: $MULTI30K (default ../shared/data/multi30k beside the checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/multi30k_en_de}
shift || true
exec scripts/train_recipe.sh configs/multi30k_en_de.yaml "$RUN" "test_2016_flickr test_2017_flickr" \
  --set data.dir="${MULTI30K:-../shared/data/multi30k}" "$@"
