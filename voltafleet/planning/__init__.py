"""What one host will serve and what it takes, decided from data before any change: the host plan, VRAM, host memory, CPU and NUMA, server flags, the build fingerprint, the unit file, restarts, the timeline of a --plan run.

Modules: hostplan, vram, hostmem, hostcpu, flags, fingerprint, unitfile, restarts, timeline.
"""
