#!/usr/bin/env bash
# A recipe, start to finish: train CONFIG, average the last 5 step checkpoints, choose the
# checkpoint (best.pt or the average), the length-penalty α and the stopping rule (exact, or
# patience 1) on the validation split, then
# score each test split once with that choice. Nothing before the last step reads a test file.
# Usage: scripts/train_recipe.sh CONFIG RUN_DIR "TEST_SPLIT ..." [extra nmt train args, e.g. --set train.threads=2]
# The data directory, the languages and the validation split are CONFIG's with the extra
# `--set section.key=value` arguments applied; each split is the file {split}.{lang} or
# {split}.{lang}.gz there (explicit data.valid_src/valid_tgt files win, as in nmt train). Before
# training starts, every file is looked for and the settings the later steps need are checked
# (step checkpoints to average; a test split that is not the validation split; a validation
# file whose name the tuning step would refuse as test data), so a mistake
# fails in one line now, not after the hour of training. A test pair whose line counts differ
# is found only by the last step (counting its lines would read it); fix it and rerun with
# --resume, which skips the finished training. Scores use the target language's BLEU
# tokenizer (ja-mecab for Japanese, ...), as nmt evaluate and nmt tune-decode choose it, and
# decoding uses train.threads CPU threads when that is set.
# Python: $PYTHON (default python3), the one nmt is installed in.
# Writes, in RUN_DIR: average.pt, tune_best.json, tune_average.json, choice.txt, and for each
# test split {split}.json (nmt evaluate --json) and {split}.hyp.{tgt} (its translations; a / in
# the split's name becomes _).
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 CONFIG RUN_DIR \"TEST_SPLIT ...\" [nmt train args]" >&2
  exit 2
fi
CONFIG=$1 RUN=$2 TESTS=$3
shift 3

# From CONFIG and the --set arguments, in their order: the target language, the CPU threads, the
# validation split's name and files, then each test split's name and files, one per line.
PLAN=$("${PYTHON:-python3}" - "$CONFIG" "$TESTS" "$@" <<'PY'
import sys
try:
    from nmt.config import load_config
    from nmt.data.corpus import find_split_file, load_split
    from nmt.errors import NmtError
    from nmt.tools.tune import looks_like_test_data
except ImportError as exc:
    sys.exit(f"error: {sys.executable} cannot import nmt ({exc}); set PYTHON to the Python nmt is installed in")
config, tests, args = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
overrides = [a.removeprefix("--set=") if a.startswith("--set=") else v for a, v in zip(args, [*args[1:], ""]) if a.startswith("--set=") or a == "--set"]
try:
    cfg = load_config(config, overrides)
except NmtError as exc:
    sys.exit(f"error: {exc}")
data, train = cfg.data, cfg.train
if train.save_every <= 0 or train.keep_last < 5:
    sys.exit(f"error: the recipe averages the last 5 step checkpoints; set train.save_every > 0 (it is {train.save_every}) and train.keep_last >= 5 (it is {train.keep_last})")
if not (data.valid_src and data.valid_tgt) and (data.hf_dataset or not data.dir):
    sys.exit("error: the recipe tunes on validation files: set data.dir (with data.valid_split) or data.valid_src and data.valid_tgt")
try:
    text = load_split(data, "valid")  # the files nmt train validates on, found as it finds them
except NmtError as exc:
    sys.exit(f"error: {exc}")
valid = (data.valid_split, text.src_path, text.tgt_path)
named_test = [str(f) for f in valid[1:] if looks_like_test_data(str(f))]
if named_test:  # nmt tune-decode refuses such a file; say so now rather than after the training
    sys.exit(f"error: the validation file {named_test[0]}'s name says test data, which tune-decode refuses to tune on; if it is a validation set, give it a name without 'test'")
rows, test_dir = [valid], data.dir or "."  # test splits are files in data.dir (here, without one)
for split in tests:
    if split == data.valid_split and not (data.valid_src and data.valid_tgt):
        sys.exit(f"error: the test split {split!r} is the validation split, which the recipe tunes on; name another")
    try:
        rows.append((split, *(find_split_file(test_dir, split, lang) for lang in (data.src_lang, data.tgt_lang))))
    except NmtError:
        sys.exit(f"error: the test split {split!r} has no {split}.{{{data.src_lang},{data.tgt_lang}}}[.gz] files in {test_dir}; the test splits are the script's third argument")
print(data.tgt_lang, train.threads, *(str(x) for row in rows for x in row), sep="\n")
PY
)  # a missing file or a bad setting stops the script here, before training, with one line saying what
mapfile -t PLAN <<< "$PLAN"
TGT=${PLAN[0]} VALID_SRC=${PLAN[3]} VALID_REF=${PLAN[4]}
THREADS=()
[ "${PLAN[1]}" -gt 0 ] && THREADS=(--threads "${PLAN[1]}")

# to_file FILE COMMAND...: COMMAND's output becomes FILE only if it succeeds (no empty or partial result is left).
to_file() {
  local file=$1 status=0
  shift
  "$@" > "$file.tmp" || status=$?
  if [ "$status" -ne 0 ]; then
    rm -f "$file.tmp"
    return "$status"
  fi
  mv "$file.tmp" "$file"
}

nmt train -c "$CONFIG" --run-dir "$RUN" "$@"
nmt average --run-dir "$RUN" --last 5 -o "$RUN/average.pt"
for ckpt in best average; do
  to_file "$RUN/tune_$ckpt.json" nmt tune-decode --checkpoint "$RUN/$ckpt.pt" --src "$VALID_SRC" --ref "$VALID_REF" "${THREADS[@]}" \
    --beam-sizes 5 --length-normalizations length --length-penalties 1.0,1.5,2.0 --patiences 0,1 --json
done
# The highest validation BLEU over both checkpoints, every α and both stopping rules (the exact one,
# and patience 1: fairseq's) (ties: the first).
read -r CKPT ALPHA PATIENCE < <("${PYTHON:-python3}" - "$RUN" <<'PY'
import json, sys
run = sys.argv[1]
rows = [(row["bleu"], name, row["length_penalty"], row["patience"] or 0) for name in ("best", "average") for row in json.load(open(f"{run}/tune_{name}.json"))["rows"]]
bleu, name, alpha, patience = max(rows, key=lambda r: r[0])
print(name, alpha, patience)
PY
)
RULE="the exact stop"
[ "$PATIENCE" != 0 ] && RULE="patience $PATIENCE"
echo "chosen on ${PLAN[2]}: $CKPT.pt, length normalisation 'length', α $ALPHA, $RULE" | tee "$RUN/choice.txt"

for ((i = 5; i < ${#PLAN[@]}; i += 3)); do
  name=${PLAN[i]//\//_}  # a split in a subdirectory (sub/test) writes sub_test.json in RUN_DIR
  to_file "$RUN/$name.json" nmt evaluate --checkpoint "$RUN/$CKPT.pt" --src "${PLAN[i + 1]}" --ref "${PLAN[i + 2]}" "${THREADS[@]}" \
    --beam-size 5 --length-normalization length --length-penalty "$ALPHA" --patience "$PATIENCE" --output "$RUN/$name.hyp.$TGT" --json
  cat "$RUN/$name.json"
done
