#!/usr/bin/env bash
# Reproduce version 2 of the shipped English model elmo-news-512 (news only) from the raw news text,
# in one command (versions 3 and 4 continue that run on news + Wikipedia: checkpoints/README.md):
#
#   bash scripts/build_news_model.sh DATA_DIR [RUN_DIR] [STEPS]
#
# DATA_DIR holds reuters21578/, abc_news/ and lm1b_heldout/ (see the model card). RUN_DIR
# (default runs/news) receives the corpus, the training run, the exported model and the
# evaluation JSON files. STEPS (default 14153, version 2's) is the number of optimizer steps.
# Every stage is skipped when its output exists, and training resumes from its last checkpoint,
# so the command can be run again after an interruption (or in several sessions) to go on.
# Set THREADS to the number of intra-op threads (default: torch's choice).
set -euo pipefail

DATA=${1:?usage: build_news_model.sh DATA_DIR [RUN_DIR] [STEPS]}
RUN=${2:-runs/news}
STEPS=${3:-14153}
ELMOKIT=${ELMOKIT:-elmokit}
if [[ -n "${THREADS:-}" ]]; then export OMP_NUM_THREADS=$THREADS; fi

CORPUS=$RUN/corpus
if ! compgen -G "$CORPUS/train/*.txt" > /dev/null; then
  python "$(dirname "$0")/prepare_lm_corpus.py" --reuters "$DATA/reuters21578" --abc "$DATA/abc_news" \
    --heldout "$DATA/lm1b_heldout" --out "$CORPUS" --shards 4
fi
if [[ ! -f $CORPUS/vocab-min3.txt ]]; then
  "$ELMOKIT" vocab "$CORPUS/train/*.txt" -o "$CORPUS/vocab-min3.txt" --min-count 3
fi

RESUME=()
if [[ -e $RUN/train/latest ]]; then RESUME=(--resume); fi
"$ELMOKIT" train --train "$CORPUS/train/*.txt" --vocab "$CORPUS/vocab-min3.txt" \
  --save-dir "$RUN/train" --config "$(dirname "$0")/../configs/news-512.json" --batch-size 64 \
  --heldout "$CORPUS/heldout/reuters-valid.txt" --checkpoint-minutes 10 --state-reset 0.01 \
  --max-steps "$STEPS" "${RESUME[@]}"

"$ELMOKIT" export "$RUN/train" "$RUN/export"
# The canonical start state, from held-out Reuters text that the evaluation below does not use.
"$ELMOKIT" start-state "$RUN/export" --text "$CORPUS/heldout/reuters-valid.txt" --sentences 4000 --write \
  --heldout "$CORPUS/heldout/reuters-test.txt"
for held in "$CORPUS/heldout/reuters-test.txt" "$DATA"/lm1b_heldout/news.en.heldout-*; do
  "$ELMOKIT" evaluate "$RUN/export" --heldout "$held" --json "$RUN/eval-$(basename "$held" .txt).json"
done
echo "model in $RUN/export (options.json, weights.hdf5 with its start state, vocab.txt, softmax.hdf5)"
