#!/bin/bash
# The `good` snapshot: the release, env files, unit and memory plan (ENV_DIR/../memory-plan, the
# memory textfile's) of the last rollout that passed its smoke test, to go back to when a later one fails.
#   vf-good record ROOT ENV_DIR GOOD_DIR UNIT    current release + env files + unit become `good`
#   vf-good restore ROOT ENV_DIR GOOD_DIR UNIT   `good` becomes current again (the caller restarts)
#   vf-good has ROOT GOOD_DIR                    exit 0 when there is a snapshot to go back to
set -euo pipefail
usage() { echo "usage: vf-good record|restore ROOT ENV_DIR GOOD_DIR UNIT | has ROOT GOOD_DIR" >&2; exit 2; }
[ $# -ge 3 ] || usage
here=$(dirname -- "$(readlink -f -- "$0")")
cmd=$1 root=$2
case "$cmd" in
  has)
    [ -L "$root/good" ] && [ -d "$3" ]
    ;;
  record)
    [ $# -eq 5 ] || usage
    env_dir=$3 good_dir=$4 unit=$5
    stage=$good_dir.stage
    rm -rf -- "$stage"
    cp -a -- "$env_dir" "$stage"
    cp -a -- "$unit" "$stage/unit"
    plan=$(dirname -- "$env_dir")/memory-plan
    if [ -f "$plan" ]; then cp -a -- "$plan" "$stage/memory-plan"; fi
    "$here/vf-atomic" dir "$stage" "$good_dir"
    rm -rf -- "$stage"
    "$here/vf-atomic" link "$root/good" "$(readlink -- "$root/current")"
    ;;
  restore)
    [ $# -eq 5 ] || usage
    env_dir=$3 good_dir=$4 unit=$5
    rm -f -- "$env_dir"/*.env
    cp -a -- "$good_dir"/*.env "$env_dir"/
    if [ -f "$good_dir/unit" ]; then "$here/vf-atomic" file "$unit" < "$good_dir/unit"; systemctl daemon-reload; fi
    if [ -f "$good_dir/memory-plan" ]; then
      "$here/vf-atomic" file "$(dirname -- "$env_dir")/memory-plan" < "$good_dir/memory-plan"
    fi
    "$here/vf-atomic" link "$root/current" "$(readlink -- "$root/good")"
    ;;
  *) usage ;;
esac
