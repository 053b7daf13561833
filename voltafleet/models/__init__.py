"""The model: its GGUF header, its size and verified state, the golden probe, the download mirrors.

Modules: gguf_header, modelmeta, modelstate, probe, mirror.
"""
