"""voltafleet's measurements, grouped by what they measure; every figure is in bench/RESULTS.md
(the planner against the H200's VRAM: bench/VRAM_TRUTH.md), every raw record in bench/records/.

    bench.gpu         the GPU proof: what runs on (or prepares) a GPU machine, and the reports
                      made from its records (bench/records/proof*, qwen35-h200-*, tier41, gpu-*)
    bench.lab         what measures the lab fleet (lab/) and the serving path on this machine:
                      load through the gateway, rollouts, faults, affinity, n-gram drafting
    bench.controller  the controller's own costs and estimates: a pyinfra run at N simulated
                      hosts, the plan's timeline against real lab rollouts
    bench.pin         the pin gate's steps that run on this machine: the sm_70 compile with CUDA 12.8's
                      pip wheels (bench/records/pin50, docs/pin.md)

Each script runs from the repository root as a module (`.venv/bin/python -m bench.gpu.gpu_proof
pack`); they import each other by their package names. Nothing here is imported by voltafleet,
roles or the deploy.
"""
