#!/bin/bash
# Remove model files that rollback no longer needs: every *.gguf under MODEL_DIR (files are
# kept by content, MODEL_DIR/<sha256 prefix>/NAME.gguf; the flat layout of older releases
# too), with its .verified, .part and .fetched, except the KEEP files (the current model, which is
# also the last good); then the directories left empty.
#   vf-prune-models MODEL_DIR KEEP...
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: vf-prune-models MODEL_DIR KEEP..." >&2; exit 2; }
dir=$1
shift
shopt -s nullglob
for f in "$dir"/*.gguf "$dir"/*.gguf.part "$dir"/*/*.gguf "$dir"/*/*.gguf.part; do
  base=${f%.part}
  for keep in "$@"; do [ "$base" = "$keep" ] && continue 2; done
  echo "voltafleet: removing $base (no longer current nor last good)" >&2
  rm -f -- "$base" "$base.verified" "$base.part" "$base.fetched"
done
find "$dir" -mindepth 1 -maxdepth 1 -type d -empty -delete
