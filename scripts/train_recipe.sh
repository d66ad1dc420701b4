#!/usr/bin/env bash
# A recipe, start to finish: train CONFIG, average the last 5 step checkpoints, choose the
# checkpoint (best.pt or the average) and the length-penalty α on the validation split, then
# score each test split once with that choice. Nothing before the last step reads a test file.
# Usage: scripts/train_recipe.sh CONFIG RUN_DIR "TEST_SPLIT ..." [extra nmt train args, e.g. --set train.threads=2]
# The data directory, the languages and the validation split are CONFIG's with the extra
# `--set section.key=value` arguments applied; each split is the file {split}.{lang} or
# {split}.{lang}.gz there, and every one is looked for before training starts (a wrong test
# split name fails now, not after the training). Scores use the target language's BLEU
# tokenizer (ja-mecab for Japanese, ...), as nmt evaluate and nmt tune-decode choose it.
# Python: $PYTHON (default python3), the one nmt is installed in.
# Writes, in RUN_DIR: average.pt, tune_best.json, tune_average.json, choice.txt, and for each
# test split {split}.json (nmt evaluate --json) and {split}.hyp.{tgt} (its translations).
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 CONFIG RUN_DIR \"TEST_SPLIT ...\" [nmt train args]" >&2
  exit 2
fi
CONFIG=$1 RUN=$2 TESTS=$3
shift 3

# The target language, then split, source file and reference file for the validation split and each test split.
PLAN=$("${PYTHON:-python3}" - "$CONFIG" "$TESTS" "$@" <<'PY'
import sys
from nmt.config import load_config
from nmt.corpus import find_split_file
from nmt.errors import NmtError
config, tests, args = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
overrides = [a.removeprefix("--set=") for a in args if a.startswith("--set=")] + [v for a, v in zip(args, args[1:]) if a == "--set"]
try:
    data = load_config(config, overrides).data
    files = [(split, find_split_file(data.dir, split, data.src_lang), find_split_file(data.dir, split, data.tgt_lang)) for split in [data.valid_split, *tests]]
except NmtError as exc:
    sys.exit(f"error: {exc}")
print(data.tgt_lang, *(line for row in files for line in row), sep="\n")
PY
)  # a missing file or a bad config stops the script here, with the helper's message
mapfile -t PLAN <<< "$PLAN"
TGT=${PLAN[0]} VALID_SRC=${PLAN[2]} VALID_REF=${PLAN[3]}

nmt train -c "$CONFIG" --run-dir "$RUN" "$@"
nmt average --run-dir "$RUN" --last 5 -o "$RUN/average.pt"
for ckpt in best average; do
  nmt tune-decode --checkpoint "$RUN/$ckpt.pt" --src "$VALID_SRC" --ref "$VALID_REF" \
    --beam-sizes 5 --length-normalizations length --length-penalties 1.0,1.5,2.0 --json > "$RUN/tune_$ckpt.json"
done
# The highest validation BLEU over both checkpoints and every α (ties: the first).
read -r CKPT ALPHA < <("${PYTHON:-python3}" - "$RUN" <<'PY'
import json, sys
run = sys.argv[1]
rows = [(row["bleu"], name, row["length_penalty"]) for name in ("best", "average") for row in json.load(open(f"{run}/tune_{name}.json"))["rows"]]
bleu, name, alpha = max(rows, key=lambda r: r[0])
print(name, alpha)
PY
)
echo "chosen on ${PLAN[1]}: $CKPT.pt, length normalisation 'length', α $ALPHA" | tee "$RUN/choice.txt"

for ((i = 4; i < ${#PLAN[@]}; i += 3)); do
  test=${PLAN[i]}
  nmt evaluate --checkpoint "$RUN/$CKPT.pt" --src "${PLAN[i + 1]}" --ref "${PLAN[i + 2]}" \
    --beam-size 5 --length-normalization length --length-penalty "$ALPHA" \
    --output "$RUN/$test.hyp.$TGT" --json | tee "$RUN/$test.json"
done
