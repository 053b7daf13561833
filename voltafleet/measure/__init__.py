"""What is measured on the servers and judged on the controller: the smoke test's client and verdict, the tune's workload client, the workload profile from logs, the autotune's choices, a memory cgroup's kernel counters.

Modules: smoke, profile, tune, cgroupmem.
"""
