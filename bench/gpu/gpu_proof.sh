#!/usr/bin/env bash
# The GPU proof on a GPU machine (bench/gpu/gpu_proof.py packs this folder; no network needed).
# Start or attach: the first call starts the run detached (setsid); every call waits up to
# WAIT seconds (0: until it ends) and copies what $RES holds into $OUT when OUT is set.
#   facts -> CUDA build through vf-build-release.sh with voltafleet's argv -> the shape-exact
#   Qwen3.6-27B Q4_K_S -> the Volta-rule variant (bench/gpu/voltarule.py: Volta's exact kernel choice) and
#   the same with FORCE_MMQ -> bench/gpu/proof_bench.py: peaks, llama-bench, the servers, the probes (issue 27)
# PHASES picks proof_bench's phases (its PHASES table; default: issue 27's); the FORCE_MMQ variant is skipped when every
# phase names the Volta-rule build (e.g. issue 32: PHASES=think32:volta), the tiny probe model unless probe27 runs.
# Issue 51 (bench/gpu/offbuild.py): BUILD_ONLY=1 ends after the variants' builds (off the GPU machine, JOBS= its
# cores); a pack with prebuilt/ (pin_proof pack51 --prebuilt) builds nothing and runs that FORCE_MMQ binary, its
# second half found in PARTS (default /tmp/prebuilt51).
set -u
W=$(cd "$(dirname "$0")" && pwd)
RES=${RES:-/tmp/proof}
mkdir -p "$RES"

if [ "${1:-}" = __run ]; then
  export PYTHONUNBUFFERED=1
  log() { echo "[$(date +%T)] $*" | tee -a "$RES/progress.txt"; }
  PH=${PHASES:-peak:volta,bench27:volta,bench27:mmq,serve27:volta,serve27:mmq,probe27,peak:mmq}
  # a phase list proof_bench would refuse (proof_bench.refused) ends the run here, before the build
  why=$(PYTHONPATH=$W python3 -c 'import sys; from bench.gpu.proof_bench import refused; print(refused(sys.argv[1].split(",")) or "")' "$PH") ||
    why="bench.gpu.proof_bench does not import"
  if [ -n "$why" ]; then log "phases: $why"; echo failed > "$RES/DONE"; exit 1; fi
  # TRAFFIC51_ONLY (bench/gpu/proof/traffic.py) naming a config the plan lacks ends the run here too
  if [ -n "${TRAFFIC51_ONLY:-}" ]; then
    why=$(PYTHONPATH=$W python3 -c 'import json, sys; from bench.gpu.proof.traffic import only; only(json.load(open(sys.argv[1])).get("traffic51", {}).get("configs", []))' "$W/plan.json" 2>&1) ||
      { log "${why##*$'\n'}"; echo failed > "$RES/DONE"; exit 1; }
  fi
  # a vocabulary the pack left in llama.cpp.git (gpu_proof.pack_sources' vocab-blobs.txt), written out once
  if [ -e "$W/vocab-blobs.txt" ]; then
    while read -r name blob; do
      [ -s "$W/$name" ] || git --git-dir="$W/llama.cpp.git" cat-file blob "$blob" > "$W/$name" ||
        { log "vocabulary $name: blob $blob is not in llama.cpp.git"; echo failed > "$RES/DONE"; exit 1; }
    done < "$W/vocab-blobs.txt"
  fi
  log "facts"
  { nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; command -v nvcc
    nvcc --version; g++ --version | head -1; cmake --version | head -1; nproc; command -v ccache; } > "$RES/facts.txt" 2>&1
  plan_get() {  # KEY FIELD: plan.json's KEY.FIELD
    python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]][sys.argv[3]])" "$W/plan.json" "$1" "$2"
  }
  plan_argv() {  # KEY: plan.json's KEY.argv (vf-build-release's), one argument a line, the pack's path in place
    python3 - "$W" "$1" <<'PY'
import json, sys
w, key = sys.argv[1], sys.argv[2]
for a in json.load(open(f"{w}/plan.json"))[key]["argv"]:
    print(a.replace("@PACK@", w).replace("\n", " "))
PY
  }
  NVCC=$(plan_get build nvcc)
  if [ ! -x "$NVCC" ]; then  # the image's toolkit under the path the plan names
    real=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    ln -sfn "$real" "$(dirname "$(dirname "$NVCC")")"
  fi
  FP=$(plan_get build fingerprint)
  mkdir -p /tmp/models
  model() {  # the shape-exact 27B (not for BUILD_ONLY)
    [ -n "${BUILD_ONLY:-}" ] && return
    PYTHONPATH=$W/gguf-py python3 "$W/qwen35gen.py" "$W/ggml-vocab-qwen35.gguf" /tmp/models/q4ks.gguf --ftype q4_k_s \
      >> "$RES/progress.txt" 2>&1
    log "model written"
  }
  IFS=, read -ra PHS <<< "$PH"
  if [ -e "$W/prebuilt/llama-server.xz.1" ]; then
    # issue 51: the pack holds the FORCE_MMQ variant with Volta's choice built off this machine by this script's
    # BUILD_ONLY run (bench/gpu/offbuild.py, the same nvcc and argv): no build here, every phase on `mmq`. Its
    # xz comes in two halves (pin_proof.pack51): the second one the session's first call left in PARTS
    for p in "${PHS[@]}"; do
      case "$p" in *:mmq) ;; *) log "prebuilt: phase $p needs a build the pack does not hold"; echo failed > "$RES/DONE"; exit 1 ;; esac
    done
    PARTS=${PARTS:-/tmp/prebuilt51}
    if [ ! -s "$PARTS/llama-server.xz.2" ]; then
      log "prebuilt: no $PARTS/llama-server.xz.2 (the first call carries it there: bench/traffic/README.md)"
      echo failed > "$RES/DONE"; exit 1
    fi
    mkdir -p /tmp/mmq/bin
    cat "$W/prebuilt/llama-server.xz.1" "$PARTS/llama-server.xz.2" |
      python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), open(sys.argv[1], "wb"))' \
      /tmp/mmq/bin/llama-server && chmod +x /tmp/mmq/bin/llama-server
    # the toolkit's libraries (cuBLAS, cudart) where the binary's RUNPATH names them, and where this machine keeps them
    LD_LIBRARY_PATH=$(dirname "$(dirname "$NVCC")")/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; export LD_LIBRARY_PATH
    { echo "prebuilt $(cat "$W/prebuilt/SHA256SUMS")"; (cd /tmp/mmq/bin && sha256sum -c "$W/prebuilt/SHA256SUMS") &&
      /tmp/mmq/bin/llama-server --version; echo "prebuilt rc=$?"; } > "$RES/build.txt" 2>&1
    if ! grep -q "^prebuilt rc=0$" "$RES/build.txt"; then
      log "prebuilt: $(grep -m1 -E 'FAILED|error|not found' "$RES/build.txt" || tail -1 "$RES/build.txt")"; echo failed > "$RES/DONE"; exit 1
    fi
    log "prebuilt ok: $(head -1 "$RES/build.txt")"
    model
    BIN=/tmp/mmq/bin BINS="mmq=/tmp/mmq/bin"
  else
    log "build $FP (background)"
    plan_argv build > /tmp/build-argv.txt
    mapfile -t ARGV < /tmp/build-argv.txt
    [ -z "${JOBS:-}" ] || ARGV[5]=$JOBS  # BUILD_ONLY off the GPU machine: its cores (the plan's argv names the GPU machine's)
    ( t0=$(date +%s); bash "${ARGV[@]}" > "$RES/build.txt" 2>&1
      echo "build rc=$? seconds=$(( $(date +%s) - t0 ))" >> "$RES/build.txt" ) &
    BUILD=$!
    model
    wait $BUILD
    BIN=/tmp/vf/releases/$FP/bin
    if [ ! -x "$BIN/llama-server" ]; then
      log "build failed"; tail -60 "/tmp/vf/build/$FP.log" >> "$RES/build.txt" 2>/dev/null; echo failed > "$RES/DONE"; exit 1
    fi
    "$BIN/llama-server" --version >> "$RES/build.txt" 2>&1
    log "build ok: $(grep 'build rc' "$RES/build.txt")"
    # issue 50: a second pin (plan.json's build_new: another commit of the pack's llama.cpp.git, its own root),
    # built by the same script beside the first pin's variants; then Volta's choice and FORCE_MMQ as `mmqnew`
    NEWB=
    if python3 -c "import json,sys; sys.exit(0 if 'build_new' in json.load(open(sys.argv[1])) else 1)" "$W/plan.json"; then
      plan_argv build_new > /tmp/build-new-argv.txt
      mapfile -t NARGV < /tmp/build-new-argv.txt
      FP2=$(plan_get build_new fingerprint)
      ROOT2=$(plan_get build_new root)
      log "build of the second pin $FP2 (background)"
      ( t0=$(date +%s); bash "${NARGV[@]}" > "$RES/build-new.txt" 2>&1
        echo "build rc=$? seconds=$(( $(date +%s) - t0 ))" >> "$RES/build-new.txt" ) &
      NEWB=$!
    fi
    # issue 27: Volta's exact kernel choice (voltarule.py: two hunks, recorded in voltarule.diff), then
    # the same tree with GGML_CUDA_FORCE_MMQ. Only mmq.cu (the choice) and ggml-cuda.cu (cuBLAS output,
    # the feature list) read what changes, so each variant rebuilds those two objects.
    src=/tmp/vf/src/llama.cpp
    variant() {  # NAME [BUILD_DIR [TARGET...]]: rebuild the targets (llama-server and llama-bench of the pin's build
      # folder unless named) in the tree as it stands, copy them to /tmp/NAME/bin
      local name=$1 dir=${2:-/tmp/vf/build/$FP} t0 rc t; shift; shift || true
      local targets=("$@"); [ ${#targets[@]} -gt 0 ] || targets=(llama-server llama-bench)
      t0=$(date +%s)
      PATH=$(dirname "$NVCC"):$PATH cmake --build "$dir" --target "${targets[@]}" -j "${JOBS:-16}" > "$RES/build-$name.txt" 2>&1
      rc=$?
      echo "$name rc=$rc seconds=$(( $(date +%s) - t0 ))" >> "$RES/build-$name.txt"
      # a failed rebuild leaves the stock binaries in the build folder: never copy those under the variant's name
      if [ "$rc" != 0 ]; then log "$name rebuild failed (rc=$rc)"; echo failed > "$RES/DONE"; exit 1; fi
      mkdir -p "/tmp/$name/bin" && for t in "${targets[@]}"; do cp "$dir/bin/$t" "/tmp/$name/bin/"; done
      "/tmp/$name/bin/llama-server" --version >> "$RES/build-$name.txt" 2>&1
      log "$(grep " rc=" "$RES/build-$name.txt")"
    }
    force_mmq() {  # SRC: GGML_CUDA_FORCE_MMQ in the two files that read it (as -DGGML_CUDA_FORCE_MMQ=ON would)
      for f in ggml/src/ggml-cuda/mmq.cu ggml/src/ggml-cuda/ggml-cuda.cu; do sed -i '1i #define GGML_CUDA_FORCE_MMQ' "$1/$f"; done
    }
    python3 "$W/bench/gpu/voltarule.py" "$src" > "$RES/voltarule.diff" || { log "voltarule: anchors moved"; echo failed > "$RES/DONE"; exit 1; }
    variant volta
    # the FORCE_MMQ variant unless every phase names the Volta-rule build (issue 32: think32:volta)
    need_mmq=0
    for p in "${PHS[@]}"; do case "$p" in *:volta) ;; *) need_mmq=1 ;; esac; done
    if [ "$need_mmq" = 1 ]; then
      force_mmq "$src"
      variant mmq
    fi
    git -C "$src" diff > "$RES/variants.diff"
    if [ -n "${BUILD_ONLY:-}" ]; then  # bench/gpu/offbuild.py: the builds alone, off the GPU machine
      log "built"; echo ok > "$RES/DONE"; exit 0
    fi
    BINS="volta=/tmp/volta/bin,mmq=/tmp/mmq/bin"
    if [ -n "$NEWB" ]; then  # the second pin: the same rule and FORCE_MMQ, so both sides take Volta's choice
      wait "$NEWB"
      if [ ! -x "$ROOT2/releases/$FP2/bin/llama-server" ]; then
        log "second pin's build failed"; tail -60 "$ROOT2/build/$FP2.log" >> "$RES/build-new.txt" 2>/dev/null
        echo failed > "$RES/DONE"; exit 1
      fi
      "$ROOT2/releases/$FP2/bin/llama-server" --version >> "$RES/build-new.txt" 2>&1
      log "second pin built: $(grep 'build rc' "$RES/build-new.txt")"
      src2=$ROOT2/src/llama.cpp
      python3 "$W/bench/gpu/voltarule.py" "$src2" > "$RES/voltarule-new.diff" ||
        { log "voltarule on the second pin: anchors moved"; echo failed > "$RES/DONE"; exit 1; }
      force_mmq "$src2"
      variant mmqnew "$ROOT2/build/$FP2" llama-server
      git -C "$src2" diff > "$RES/variants-new.diff"
      BINS="$BINS,mmqnew=/tmp/mmqnew/bin"
    fi
  fi
  case "$PH" in *tier41*)  # issue 41: the MTP-carrying file, every draft accepted (acc) and every draft rejected (rej)
    PYTHONPATH=$W/gguf-py python3 "$W/qwen35gen.py" "$W/ggml-vocab-qwen35.gguf" /tmp/models/q4ks-mtp-acc.gguf --mtp \
      --accept >> "$RES/progress.txt" 2>&1
    PYTHONPATH=$W/gguf-py python3 "$W/qwen35gen.py" "$W/ggml-vocab-qwen35.gguf" /tmp/models/q4ks-mtp-rej.gguf --mtp \
      >> "$RES/progress.txt" 2>&1
    log "MTP files written" ;;
  esac
  case "$PH" in *traffic51*)  # issue 51: the same shape with seeded random words out, so answers differ with the prompt
    PYTHONPATH=$W/gguf-py python3 "$W/qwen35gen.py" "$W/ggml-vocab-qwen35.gguf" /tmp/models/q4ks-vary.gguf --ftype q4_k_s \
      --vary 51 >> "$RES/progress.txt" 2>&1
    log "varying file written" ;;
  esac
  case "$PH" in *probe27*)  # a random-weight qwen35 for the probes, its 2-D weights in Q8_0 (gguf-py's quantizer: the
    # Q8_0 file proof27 run2 asked of llama-quantize never loaded: its log did not come back, and requantizing the Q4_0
    # token table needs --allow-requantize, the likely cause; loaded by the pinned CPU llama-server here)
    PYTHONPATH=$W/gguf-py python3 "$W/qwen35gen.py" "$W/ggml-vocab-qwen35.gguf" /tmp/models/tiny-q8_0.gguf --shape tiny \
      --dense --dense-type q8_0 >> "$RES/progress.txt" 2>&1 ;;
  esac
  B=(python3 -m bench.gpu.proof_bench --plan "$W/plan.json" --bin "$BIN" --bins "$BINS"
     --models /tmp/models --res "$RES")
  PYTHONPATH=$W "${B[@]}" --phases "$PH" 2>&1 | tee -a "$RES/progress.txt"
  ( cd /tmp && tar czf "$RES/logs.tgz" load-*.log 2>/dev/null )
  log "done"
  echo ok > "$RES/DONE"
  exit 0
fi

if [ ! -e "$RES/STARTED" ]; then
  date > "$RES/STARTED"
  setsid bash "$0" __run > "$RES/pipeline.txt" 2>&1 < /dev/null &
fi
WAIT=${WAIT:-540}
t0=$(date +%s)
while [ ! -e "$RES/DONE" ] && { [ "$WAIT" = 0 ] || [ $(( $(date +%s) - t0 )) -lt "$WAIT" ]; }; do sleep 5; done
if [ -n "${OUT:-}" ]; then
  # the servers' whole logs, also mid-run (issue 51 counts checkpoints and cache saves in them)
  ( cd /tmp && tar czf "$RES/logs.tgz" load-*.log 2>/dev/null )
  if [ -e "$RES/build-new.txt" ]; then  # two pins: the builds' logs and diffs in one file ($OUT brings back 8)
    ( cd "$RES" && tar czf "$OUT/builds.tgz" build*.txt ./*.diff 2>/dev/null )
    KEEP="results.json progress.txt facts.txt logs.tgz pipeline.txt"
  else
    KEEP="results.json progress.txt build.txt build-volta.txt build-mmq.txt voltarule.diff facts.txt logs.tgz"
  fi
  for f in $KEEP; do
    [ -e "$RES/$f" ] && cp "$RES/$f" "$OUT/"
  done
fi
tail -25 "$RES/progress.txt" 2>/dev/null
[ -e "$RES/DONE" ] && echo "DONE: $(cat "$RES/DONE")" || echo "still running"
