#!/bin/bash
# Remove model files that rollback no longer needs: every *.gguf in MODEL_DIR (and its
# .verified and .part) except the KEEP files (the current model, which is also the last good).
#   vf-prune-models MODEL_DIR KEEP...
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: vf-prune-models MODEL_DIR KEEP..." >&2; exit 2; }
dir=$1
shift
shopt -s nullglob
for f in "$dir"/*.gguf "$dir"/*.gguf.part; do
  base=${f%.part}
  for keep in "$@"; do [ "$base" = "$keep" ] && continue 2; done
  echo "voltafleet: removing $base (no longer current nor last good)" >&2
  rm -f -- "$base" "$base.verified" "$base.part"
done
