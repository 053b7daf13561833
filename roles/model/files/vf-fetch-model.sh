#!/bin/bash
# Fetch a model file resumably and verify it; only a verified file ever lands at DEST.
#   vf-fetch-model URL DEST [SHA256]
# The download goes to DEST.part (kept on a broken transfer, so the next run resumes it);
# a wrong checksum removes the download and leaves DEST alone. DEST.verified records
# `sha256 size mtime` so later runs need not re-hash 15 GB. After a download, DEST.fetched holds
# `BYTES MICROSECONDS`: what this run downloaded and curl's time (roles/model reads and removes it).
set -euo pipefail
[ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: vf-fetch-model URL DEST [SHA256]" >&2; exit 2; }
url=$1 dest=$2 want=${3:-}
part=$dest.part
dir=$(dirname -- "$dest")
mkdir -p -- "$dir"
chmod 755 -- "$dir"
got=""
if [ -f "$dest" ] && [ -n "$want" ]; then got=$(sha256sum < "$dest" | cut -d' ' -f1); fi
if [ -z "$want" ] || [ "$got" != "$want" ]; then
  # progress for the operator: bytes and rate every 30 s (the sleep holds none of our output:
  # killed with its loop at exit, a sleep still holding stderr would keep the caller waiting 30 s)
  ( prev=$(stat -c %s -- "$part" 2>/dev/null || echo 0)
    while sleep 30 >/dev/null 2>&1; do
      now=$(stat -c %s -- "$part" 2>/dev/null || echo 0)
      echo "voltafleet: downloading $(basename -- "$dest"): $(( now / 1048576 )) MiB, $(( (now - prev) / 30 / 1048576 )) MiB/s" >&2
      prev=$now
    done ) &
  ticker=$!
  trap 'kill "$ticker" 2>/dev/null || true' EXIT
  start=$(stat -c %s -- "$part" 2>/dev/null || echo 0)
  t0=$(date +%s%N)
  rc=0
  curl -fsSL --retry 5 --retry-delay 2 --connect-timeout 20 -C - -o "$part" -- "$url" || rc=$?
  kill "$ticker" 2>/dev/null || true
  took=$(( ($(date +%s%N) - t0) / 1000 ))  # microseconds
  if [ $rc -ne 0 ]; then
    # 22/33: the server refused the resume (e.g. 416, the partial is already whole): verify it below.
    if { [ $rc -ne 22 ] && [ $rc -ne 33 ]; } || [ ! -s "$part" ]; then
      echo "voltafleet: download of $url failed (curl exit $rc); partial kept at $part, the next run resumes it; $dest untouched" >&2
      exit 1
    fi
  fi
  got=$(sha256sum < "$part" | cut -d' ' -f1)
  if [ -n "$want" ] && [ "$got" != "$want" ]; then
    rm -f -- "$part"
    echo "voltafleet: sha256 of the download is $got (from $url), model_sha256 says $want; removed the download, $dest untouched" >&2
    exit 1
  fi
  chmod 644 -- "$part"
  mv -f -- "$part" "$dest"
  echo "$(( $(stat -c %s -- "$dest") - start )) $took" > "$dest.fetched"
fi
echo "$got $(stat -c '%s %Y' -- "$dest")" > "$dest.verified.tmp"
mv -f -- "$dest.verified.tmp" "$dest.verified"
