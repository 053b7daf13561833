"""The model: its files on a host (parts, draft, checksums, where each lives), its GGUF header, its size and verified state, the golden probe, the download mirrors.

Modules: modelfiles, gguf_header, modelmeta, modelstate, probe, mirror.
"""
