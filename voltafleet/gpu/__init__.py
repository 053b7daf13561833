"""The NVIDIA stack and the boards: driver and toolkit packages for Volta fleets, GPU health.

Modules: nvidia, gpuhealth.
"""
