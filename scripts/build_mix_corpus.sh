#!/usr/bin/env bash
# Rebuild the training corpus of the news + Wikipedia continuation of elmo-news-512 (the run in
# checkpoints/news-512), byte for byte, and check it against checkpoints/corpus-mix2.sha256:
#
#   bash scripts/build_mix_corpus.sh DATA_DIR [OUT_DIR]
#
# DATA_DIR holds reuters21578/, abc_news/, wikipedia/ and lm1b_heldout/. OUT_DIR (default runs)
# receives corpus/ (news only: the vocabulary's corpus, 4 shards), corpus-wiki/ (news + Wikipedia,
# 16 shards, with heldout/wikipedia-test.txt) and corpus-mix2/ (24 shards that each mix news,
# counted three times, and Wikipedia). A stage whose output exists is skipped.
set -euo pipefail

DATA=${1:?usage: build_mix_corpus.sh DATA_DIR [OUT_DIR]}
OUT=${2:-runs}
HERE=$(cd "$(dirname "$0")" && pwd)
SUMS=${MIX_SUMS:-$HERE/../checkpoints/corpus-mix2.sha256}  # MIX_SUMS: another list (tests)
COMMON=(--reuters "$DATA/reuters21578" --abc "$DATA/abc_news" --heldout "$DATA/lm1b_heldout")

if ! compgen -G "$OUT/corpus/train/*.txt" > /dev/null; then
  python "$HERE/prepare_lm_corpus.py" "${COMMON[@]}" --out "$OUT/corpus" --shards 4
fi
if ! compgen -G "$OUT/corpus-wiki/train/*.txt" > /dev/null; then
  python "$HERE/prepare_lm_corpus.py" "${COMMON[@]}" --wikipedia "$DATA/wikipedia" \
    --out "$OUT/corpus-wiki" --shards 16
fi
if ! compgen -G "$OUT/corpus-mix2/*.txt" > /dev/null; then
  # The news shards are given three times: news counts three times in the mix.
  python "$HERE/mix_shards.py" "$OUT/corpus-wiki/train/*.txt" "$OUT/corpus/train/*.txt" \
    "$OUT/corpus/train/*.txt" --out "$OUT/corpus-mix2" --shards 24 --seed 0
fi
(cd "$OUT/corpus-mix2" && sha256sum --quiet -c "$SUMS")
echo "corpus in $OUT/corpus-mix2 matches $(basename "$SUMS")"
