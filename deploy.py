"""voltafleet: serve a Qwen 27B Q4_K_S GGUF with llama-server on every GPU of the fleet.

    pyinfra -y inventory/prod.py deploy.py     # the fleet
    pyinfra -y inventory/lab.py deploy.py      # the lab fleet on this machine (CPU backend)

Top to bottom: preflight (refuse bad hosts before any change), toolchain, llama.cpp
release, model, servers, smoke test (with rollback).
"""
from roles.llama_cpp import llama_cpp
from roles.model import model
from roles.preflight import preflight
from roles.server import server
from roles.smoke import smoke
from roles.toolchain import toolchain

ctx = preflight()
toolchain(ctx)
llama_cpp(ctx)
model_ops = model(ctx)
server(ctx, model_ops)
smoke(ctx)
