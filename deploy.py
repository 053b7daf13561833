"""voltafleet: serve a Qwen 27B Q4_K_S GGUF with llama-server on every GPU of the fleet.

    pyinfra -y inventory/prod.py deploy.py     # the fleet
    pyinfra -y inventory/lab.py deploy.py      # the lab fleet on this machine (CPU backend)

Top to bottom: preflight (facts and the host's plan; refuse bad hosts before any change),
helper scripts, toolchain, llama.cpp release, model, servers, smoke test (with rollback).
"""
from roles.helpers import helpers
from roles.llama_cpp import llama_cpp
from roles.model import model
from roles.preflight import preflight
from roles.server import server
from roles.smoke import smoke
from roles.toolchain import toolchain

plan = preflight()
helpers(plan)
toolchain(plan)
llama_cpp(plan)
model_ops = model(plan)
restart_op = server(plan, model_ops)
smoke(plan, restart_op)
