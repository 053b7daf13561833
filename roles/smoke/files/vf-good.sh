#!/bin/bash
# The `good` snapshot: the release and env files of the last rollout that passed its smoke test.
#   vf-good record ROOT ENV_DIR GOOD_DIR     current release + env files become `good`
#   vf-good restore ROOT ENV_DIR GOOD_DIR    `good` becomes current again (the caller restarts)
#   vf-good has ROOT GOOD_DIR                exit 0 when there is a snapshot to go back to
set -euo pipefail
usage() { echo "usage: vf-good record|restore ROOT ENV_DIR GOOD_DIR | has ROOT GOOD_DIR" >&2; exit 2; }
[ $# -ge 3 ] || usage
here=$(dirname -- "$(readlink -f -- "$0")")
cmd=$1 root=$2
case "$cmd" in
  has)
    [ -L "$root/good" ] && [ -d "$3" ]
    ;;
  record)
    [ $# -eq 4 ] || usage
    "$here/vf-atomic" link "$root/good" "$(readlink -- "$root/current")"
    "$here/vf-atomic" dir "$3" "$4"
    ;;
  restore)
    [ $# -eq 4 ] || usage
    env_dir=$3 good_dir=$4
    rm -f -- "$env_dir"/*.env
    cp -a -- "$good_dir"/*.env "$env_dir"/
    "$here/vf-atomic" link "$root/current" "$(readlink -- "$root/good")"
    ;;
  *) usage ;;
esac
