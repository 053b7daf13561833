"""The GPU proof (issues 3, 19, 27, 29, 32, 38, 41): what runs on a GPU machine, what prepares it,
and the reports made from its raw records (bench/records/).

On the controller: gpu_proof (pack: llama.cpp at the pin, voltafleet's build script and every
argv rendered from group_vars; report), groups (a group's variables as a host gets them),
tune29 (issue 29's tune planned and judged), proof_report, tier41, qwen35_report and vram_truth
(the tables of bench/RESULTS.md and bench/VRAM_TRUTH.md from the records), and the older
pipelines' packers gpu_prep and qwen35_prep.

On the GPU machine (stdlib only, packed by gpu_proof at their repository paths, so that
`python3 -m bench.gpu.proof_bench` imports as here): proof_bench (the phase table and its runner's
loop) and the package proof (the measurements, one module for each thing measured: GPU memory under
load, the kernels' speed, a server's rounds, the probes, the tune, the thinking budget, host memory,
the tiers; proof.runner the state they share), qwen35_bench (the server runs it builds on; also the
older qwen35 pipeline's), voltarule (Volta's kernel choice on the pinned source), and the shell
pipelines gpu_proof.sh, gpu_run.sh and qwen35_gpu.sh. v100_measure runs on a fleet's first V100
host, beside qwen35_bench and proof.runner; pin_sm70 (the pin gate's sm_70 compile evidence) where a
CUDA 12.x nvcc is, a fleet host's toolkit.

This file is shipped to the GPU machine: it imports nothing.
"""
