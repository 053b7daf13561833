#!/bin/bash
# voltafleet's one atomic-switch helper: nothing is ever half replaced.
#   vf-atomic link LINK TARGET     point symlink LINK at TARGET (ln to LINK.tmp, then rename)
#   vf-atomic dir SRC DEST         replace directory DEST by a copy of SRC (copy to DEST.tmp, then swap)
#   vf-atomic file DEST            write stdin to DEST (DEST.tmp, then rename)
set -euo pipefail
usage() { echo "usage: vf-atomic link LINK TARGET | dir SRC DEST | file DEST" >&2; exit 2; }
[ $# -ge 2 ] || usage
case "$1" in
  link)
    [ $# -eq 3 ] || usage
    ln -sfn -- "$3" "$2.tmp"
    mv -T -- "$2.tmp" "$2"
    ;;
  dir)
    [ $# -eq 3 ] || usage
    rm -rf -- "$3.tmp" "$3.old"
    cp -a -- "$2" "$3.tmp"
    if [ -e "$3" ]; then mv -T -- "$3" "$3.old"; fi
    mv -T -- "$3.tmp" "$3"
    rm -rf -- "$3.old"
    ;;
  file)
    [ $# -eq 2 ] || usage
    cat > "$2.tmp"
    mv -f -- "$2.tmp" "$2"
    ;;
  *) usage ;;
esac
