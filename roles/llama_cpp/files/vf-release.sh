#!/bin/bash
# Releases under ROOT/releases: pack one for shipping, install a shipped one, prune old ones.
#   vf-release pack ROOT FP                  -> ROOT/releases/FP.tar.gz (written whole)
#   vf-release install ROOT FP SHA256 FILE   checksum, unpack, self-check, then appear whole
#   vf-release prune ROOT FP...              remove releases, their archives and build trees
set -euo pipefail
usage() { echo "usage: vf-release pack ROOT FP | install ROOT FP SHA256 FILE | prune ROOT FP..." >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1 root=$2
shift 2
cd "$root/releases"
case "$cmd" in
  pack)
    [ $# -eq 1 ] || usage
    fp=$1
    [ -f "$fp/BUILD_INFO.json" ] || { echo "voltafleet: no release $fp here to ship" >&2; exit 3; }
    tar -czf "$fp.tar.gz.tmp" -- "$fp"
    mv -f -- "$fp.tar.gz.tmp" "$fp.tar.gz"
    ;;
  install)
    [ $# -eq 3 ] || usage
    fp=$1 sha=$2 file=$3
    echo "$sha  $file" | sha256sum -c --quiet
    rm -rf -- "$fp.tmp"
    mkdir -- "$fp.tmp"
    tar -C "$fp.tmp" --strip-components=1 -xzf "$file"
    "$fp.tmp/bin/llama-server" --version >/dev/null 2>&1 || { echo "voltafleet: shipped llama-server fails --version" >&2; exit 1; }
    mv -T -- "$fp.tmp" "$fp"
    rm -f -- "$file"
    ;;
  prune)
    for fp in "$@"; do
      rm -rf -- "$fp" "$fp.tar.gz" "$root/build/$fp" "$root/build/$fp.log" "$root/build/$fp.seconds"
    done
    ;;
  *) usage ;;
esac
