"""voltafleet: serve a Qwen 27B Q4_K_S GGUF with llama-server on every GPU of the fleet.

    pyinfra -y inventory/prod.py deploy.py     # every host at once (a first install)
    python -m rollout inventory/prod.py        # canary, then batches: the fleet keeps serving
    pyinfra -y inventory/lab.py deploy.py      # the lab fleet on this machine (CPU backend)

Server hosts, top to bottom: preflight (facts and the host's plan; refuse bad hosts before
any change), helper scripts, toolchain, llama.cpp release, model, servers, smoke test
(restart, with rollback on any failure). Hosts of the `gateway` group run HAProxy in front of every server;
hosts of the `mirror` group run nginx caching the model, which the server hosts then fetch through
(one download per mirror). A host may be both; neither runs llama-server.
The rolling driver runs this file per phase (VOLTAFLEET_PHASE: preflight, gateway, batch; plan:
preflight and the plan role only, reading facts, changing nothing; tune: a trial on the canary;
profile: the logs the tune's workload is recorded from, nothing else); gateways and mirrors are
configured in the gateway phase, before the first batch (in a plain run, their operations come
first: every host passes one operation of this file's after theirs, before any server host's).
"""
from pyinfra import host

from roles import speed

speed.applied()  # pyinfra's per-operation cost cut (roles/speed.py); a warning when this pyinfra is not the checked one
from roles.gateway_api import drain_host, is_gateway, is_mirror, is_server, mirrors_and_gateways_first
from roles.run import run_context
from roles.activation import activation
from roles.gateway import gateway
from roles.gateway_pair import gateway_pair
from roles.helpers import helpers
from roles.llama_cpp import llama_cpp
from roles.mirror import mirror
from roles.model import model
from roles.dryrun import dry_run
from roles.preflight import preflight
from roles.profile import recorded
from roles.server import server
from roles.smoke import smoke
from roles.toolchain import toolchain
from roles.tune import held, tuned

phase = run_context().phase

if phase == "profile":  # python -m rollout --tune --profile-hours N: the logs the workload is read from; no change
    recorded("server" if is_server(host) else "gateway")
elif not is_server(host):
    if phase in ("all", "gateway"):
        if is_mirror(host):
            mirror()  # before any server host's model fetch
        if is_gateway(host):
            gateway()
            gateway_pair()  # two gateways or more: keepalived moves the fleet's address to a live one
if phase == "all":
    mirrors_and_gateways_first(host.state)  # every host, this line: the server hosts' operations come after
if is_server(host) and phase not in ("profile", "gateway"):  # the gateway phase: gateways and mirrors only
    plan = preflight()
    if phase == "plan":
        dry_run(plan)  # read only: what a batch would change, or why preflight refuses (python -m rollout --plan)
    elif phase in ("all", "batch", "tune"):
        if phase == "tune":
            held(name="The canary's instances out of rotation for the trial", plan=plan)
        helpers(plan)
        driver_op = toolchain(plan, before_driver_change=drain_host(plan))  # drained before a driver change
        llama_cpp(plan)
        model_ops = model(plan)
        changes = server(plan, [*model_ops, driver_op])  # a new model or driver restarts every instance
        judge = smoke(plan)  # the probes' prompts in place; how this host is measured and judged
        activation(plan, changes, judge)  # restart (drained), judge, rollback on any failure; the outcome record
        if phase == "tune":
            tuned(plan)  # python -m rollout --tune: the workload on the drained canary, tune-<host>.json
