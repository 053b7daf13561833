#!/usr/bin/env bash
# Runs on the lent GPU machine (see bench/gpu/gpu_prep.py): facts, the CUDA build through
# voltafleet's build script, nvcc 13 asked for sm_70, a qwen2 model quantized to Q4_K_S
# and Q8_0, llama-server loads at several ctx/KV settings (memory measured), smoke client.
set -u
export PYTHONUNBUFFERED=1
D=$PWD/.device
R=$OUT
log() { echo "[gpu_run $(date +%T)] $*"; }

log "environment"
{ nvidia-smi; command -v nvcc; nvcc --version; g++ --version | head -1; cmake --version | head -1;
  command -v ccache git ninja; nproc; free -g; } > $R/build.txt 2>&1
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x /usr/local/cuda-13.0/bin/nvcc ] || ln -sfn "$(dirname "$(dirname "$(readlink -f "$NVCC")")")" /usr/local/cuda-13.0

if [ -n "${FACTS:-}" ]; then
log "facts (the exact commands of roles/facts.py)"
python3 - "$D/facts.json" "$R/facts.json" <<'PY'
import json, subprocess, sys
cmds = json.load(open(sys.argv[1]))
out = {k: subprocess.run(["bash", "-c", v], capture_output=True, text=True).stdout for k, v in cmds.items()}
json.dump(out, open(sys.argv[2], "w"), indent=1)
PY
fi

log "model generation (background)"
( PYTHONPATH=$D/gguf-py:$D python3 -c "
import tinymodel
tinymodel.write('$D/ggml-vocab-qwen2.gguf', '/tmp/m-f16.gguf', shape=dict(n_layer=36, n_embd=2560, n_head=20, n_head_kv=4, n_ff=9728, n_ctx=32768))
" > $R/modelgen.txt 2>&1 ) &
GEN=$!

log "build through voltafleet's build script"
sed "s#/DEVICE_REPO#$PWD#" $D/build.sh > /tmp/build.sh
t0=$(date +%s); bash /tmp/build.sh >> $R/build.txt 2>&1; rc=$?; t1=$(date +%s)
echo "build rc=$rc seconds=$((t1-t0))" | tee -a $R/build.txt
FP=$(cat $D/fingerprint); BIN=/tmp/vf/releases/$FP/bin
tail -5 /tmp/vf/build/$FP.log >> $R/build.txt 2>/dev/null
$BIN/llama-server --version >> $R/build.txt 2>&1

log "nvcc 13 asked for sm_70"
echo "=== sm_70 with nvcc 13: cmake configure" >> $R/build.txt
eval "cmake -S /tmp/vf/src/llama.cpp -B /tmp/sm70 $(cat $D/sm70-flags)" > /tmp/sm70.txt 2>&1; echo "configure rc=$?" >> /tmp/sm70.txt
grep -v "^--" /tmp/sm70.txt | tail -40 >> $R/build.txt

wait $GEN; log "model written: $(ls -la /tmp/m-f16.gguf)"
$BIN/llama-quantize /tmp/m-f16.gguf /tmp/m-q4ks.gguf Q4_K_S 16 > $R/quant.txt 2>&1
rm -f /tmp/m-f16.gguf
ls -la /tmp/m-*.gguf >> $R/quant.txt
head -c 12000000 /tmp/m-q4ks.gguf > $R/header-q4ks.bin

log "loads"
base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
python3 - "$D/configs.json" "$BIN/llama-server" "$base" "$R/loads.json" <<'PY'
import json, re, subprocess, sys, time, urllib.request
configs, binary, base, out = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3]), sys.argv[4]
results = []
for model in ("q4ks",):
    for c in configs:
        args = [a.replace("MODEL", f"/tmp/m-{model}.gguf") for a in c["args"]]
        logf = f"/tmp/load-{model}-{c['name']}.log"
        p = subprocess.Popen([binary] + args, stdout=open(logf, "w"), stderr=subprocess.STDOUT)
        ok = False
        for _ in range(240):
            try:
                if urllib.request.urlopen("http://127.0.0.1:18080/health", timeout=2).status == 200:
                    ok = True; break
            except Exception:
                time.sleep(0.5)
            if p.poll() is not None:
                break
        time.sleep(1)
        q = lambda *a: subprocess.run(["nvidia-smi", *a], capture_output=True, text=True).stdout.strip()
        r = {"model": model, **{k: c[k] for k in ("name", "ctx", "parallel", "k", "v")}, "healthy": ok,
             "gpu_used_mib": int(q("--query-gpu=memory.used", "--format=csv,noheader,nounits").splitlines()[0]),
             "baseline_mib": base, "apps": q("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")}
        text = open(logf).read()
        r["log"] = [l for l in text.splitlines() if re.search(r"buffer size|offloaded|KV self size|n_ctx|CUDA0|graph", l)][:60]
        if model == "q4ks" and c["name"] == "c8k-q8-np4" and ok:
            s = subprocess.run(["python3", "/DEV/voltafleet-smoke".replace("/DEV", sys.argv[1].rsplit("/", 1)[0]),
                                "--port", "18080", "--tokens", "128", "--parallel", "4", "--health-timeout", "60"],
                               capture_output=True, text=True)
            r["smoke"] = s.stdout.strip() or s.stderr[-2000:]
        p.terminate(); p.wait(timeout=30)
        results.append(r)
        print(model, c["name"], ok, r["gpu_used_mib"] - base, flush=True)
json.dump(results, open(out, "w"), indent=1)
PY
log "done"
