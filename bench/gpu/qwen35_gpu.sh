#!/usr/bin/env bash
# The H200 pipeline for the real Qwen3.6-27B shape (bench/gpu/qwen35_prep.py packs .gpuwork).
# Runs detached (setsid) so that several device calls can poll it: everything it finds
# goes to $RES (default /tmp/res); each call copies $RES into its own $OUT.
#   facts -> CUDA build through voltafleet's build script (background)
#         -> sparse full-shape models (Q4_K_S, Q4_K_S + MTP, Q8_0) -> bench/gpu/qwen35_bench.py
set -u
export PYTHONUNBUFFERED=1
W=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$W")
RES=${RES:-/tmp/res}
mkdir -p $RES /tmp/models
log() { echo "[$(date +%T)] $*" | tee -a $RES/progress.txt; }

log "facts"
{ nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv; command -v nvcc;
  nvcc --version; g++ --version | head -1; cmake --version | head -1; nproc; free -g; df -h /tmp; } > $RES/facts.txt 2>&1
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x /usr/local/cuda-13.0/bin/nvcc ] || ln -sfn "$(dirname "$(dirname "$(readlink -f "$NVCC")")")" /usr/local/cuda-13.0

log "build (background)"
sed "s#/DEVICE_REPO#$ROOT#" $W/build.sh > /tmp/build.sh
( t0=$(date +%s); bash /tmp/build.sh > $RES/build.txt 2>&1; echo "build rc=$? seconds=$(( $(date +%s) - t0 ))" >> $RES/build.txt ) &
BUILD=$!

log "models"
for spec in ${MODELS:-"q4ks:--ftype q4_k_s" "q4ks-mtp:--ftype q4_k_s --mtp" "q8_0:--ftype q8_0"}; do
  name=${spec%%:*}; flags=${spec#*:}
  PYTHONPATH=$W/gguf-py python3 $W/qwen35gen.py $W/ggml-vocab-qwen35.gguf /tmp/models/$name.gguf $flags >> $RES/progress.txt 2>&1
done
head -c 16000000 /tmp/models/q4ks.gguf | gzip > $RES/header-q4ks.bin.gz
log "models written"

log "bandwidth"
python3 - > $RES/bandwidth.json 2>>$RES/progress.txt <<'PY'
import json, torch
n = 4 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(20): b.copy_(a)
e.record(); torch.cuda.synchronize()
ms = s.elapsed_time(e) / 20
print(json.dumps({"bytes_copied": n, "ms": ms, "read_plus_write_GBps": 2 * n / ms / 1e6,
                  "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}))
PY
cat $RES/bandwidth.json >> $RES/progress.txt

wait $BUILD
tail -3 $RES/build.txt >> $RES/progress.txt
FP=$(cat $W/fingerprint); BIN=/tmp/vf/releases/$FP/bin
if [ ! -x $BIN/llama-server ]; then
  log "build failed"; tail -60 /tmp/vf/build/$FP.log >> $RES/build.txt 2>/dev/null; echo done > $RES/DONE; exit 1
fi
$BIN/llama-server --version >> $RES/build.txt 2>&1
log "build ok: $(tail -2 $RES/build.txt | head -1)"

python3 $W/qwen35_bench.py --plan $W/${PLAN:-plan.json} --bin $BIN --models /tmp/models --res $RES ${PHASES:-} 2>&1 | tee -a $RES/progress.txt
( cd /tmp && tar czf $RES/logs.tgz load-*.log 2>/dev/null )
log "done"
echo done > $RES/DONE
