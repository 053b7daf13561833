"""The pin gate's steps that run on this machine (issue 50), one module a step.

    sm70_compile   llama.cpp at a ref compiled for sm_70 with CUDA 12.8's pieces from NVIDIA's pip wheels
                   (toolkit: how that private toolkit is assembled), linked, its sm_70 kernels listed
                   by cuobjdump and grouped (MMQ, MMVQ, flash attention, other); records in
                   bench/records/pin50/. How to run it and what it proves: docs/pin.md.

Each runs from the repository root as a module (`.venv/bin/python -m bench.pin.sm70_compile --ref b11434`).
"""
