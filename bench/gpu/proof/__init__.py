"""The GPU proof's measurements, one module for each thing measured (bench/gpu/proof_bench.py's
PHASES names each phase's function; `python3 -m bench.gpu.proof_bench` runs them on the GPU machine):

    runner        ProofRun (what every phase shares: the command line, plan.json, results.json, the
                  builds' binaries, the servers) and the instruments: GPU and host memory samplers,
                  requests released all at once
    loads         GPU memory of a loaded server and its peak under one prompt per slot (vram, vram_named, peak)
    kernel_speed  llama-bench and llama-batched-bench, no server (pp, tg, bench27, batched)
    serving       a server's rounds of concurrent streams, multi-turn and n-gram drafting (serve, serve27, spec)
    probes        the smoke client's quality probes through both builds (probe27)
    tuning        the group's tune settings under its workload (tune29)
    thinking      what a thinking budget costs, streamed chats over kept-alive connections (think32)
    hostmem       llama-server's host memory and context checkpoints under real chats (host38)
    tiers         the latency tier (2 slots, MTP speculation) against the throughput tier (tier41)

Stdlib only (voltafleet's host-side clients imported inside the phases that drive them): the pack
(bench/gpu/gpu_proof.py MACHINE_SOURCES) ships every module here. This file imports nothing.
"""
