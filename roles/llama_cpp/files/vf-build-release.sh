#!/bin/bash
# Compile llama.cpp at COMMIT into release FP under ROOT; `current` is never touched here.
#   vf-build-release ROOT FP REPO COMMIT JOBS CUDA_BIN INFO_JSON TARGETS -- CMAKE_FLAGS...
# JOBS: a number or "auto" (nproc); CUDA_BIN: the pinned toolkit's bin dir or "-";
# TARGETS: space-separated CMake targets. The release appears whole (mv) or not at all.
set -euo pipefail
[ $# -ge 9 ] && [ "$9" = "--" ] || { echo "usage: vf-build-release ROOT FP REPO COMMIT JOBS CUDA_BIN INFO_JSON TARGETS -- FLAGS..." >&2; exit 2; }
root=$1 fp=$2 repo=$3 commit=$4 jobs=$5 cuda_bin=$6 info=$7 targets=$8
shift 9
read -r -a target_list <<< "$targets"
[ "$jobs" = auto ] && jobs=$(nproc)
[ "$cuda_bin" != - ] && export PATH="$cuda_bin:$PATH"
# ccache through CMake's environment: the cache is not part of the fingerprint
export CCACHE_DIR=/var/cache/voltafleet/ccache
if command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
mkdir -p "$root/src" "$root/build" "$root/releases" "$CCACHE_DIR"
src=$root/src/llama.cpp
[ -d "$src/.git" ] || git init -q "$src"
cd "$src"
git fetch -q --depth 1 -- "$repo" "$commit"
git checkout -q --force --detach "$commit"
build=$root/build/$fp
log=$build.log
t0=$(date +%s)
echo "voltafleet: compiling llama.cpp ${commit:0:12} as release $fp on $(hostname)" >&2
# progress for the operator: the build step every 30 s, not minutes of silence
( while sleep 30 >/dev/null 2>&1; do  # the sleep holds none of our output (see vf-fetch-model)
    step=$(grep -o '\[ *[0-9]*%\]' "$log" 2>/dev/null | tail -n 1 || true)
    echo "voltafleet: compiling $fp: $(( $(date +%s) - t0 )) s elapsed ${step:-configuring}" >&2
  done ) &
ticker=$!
trap 'kill "$ticker" 2>/dev/null || true' EXIT
if ! { cmake -S . -B "$build" "$@" && cmake --build "$build" --target "${target_list[@]}" -j "$jobs"; } >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "voltafleet: build failed, log in $log; current release untouched" >&2
  exit 1
fi
echo $(( $(date +%s) - t0 )) > "$build.seconds"
tmp=$root/releases/$fp.tmp
rm -rf -- "$tmp"
mkdir -p "$tmp/bin"
for t in "${target_list[@]}"; do cp -- "$build/bin/$t" "$tmp/bin/"; done
"$tmp/bin/llama-server" --version >/dev/null 2>&1 || { echo "voltafleet: new llama-server fails --version" >&2; exit 1; }
printf '%s\n' "$info" > "$tmp/BUILD_INFO.json"
mv -T -- "$tmp" "$root/releases/$fp"
echo "voltafleet: release $fp built in $(( $(date +%s) - t0 )) s" >&2
