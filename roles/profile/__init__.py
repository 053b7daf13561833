"""Profile: the log lines the tune's workload is recorded from (VOLTAFLEET_PHASE=profile; reads
only). The gateway's HAProxy log (requests in flight on the canary's instances) and the canary's
llama-server journals (each request's prompt, cached prefix and answer) of the last
`tune_profile_hours` go to profile-<host>.json in the run directory; voltafleet/measure/profile.py makes
them into the tune_* values (`python -m rollout INVENTORY --tune --profile-hours N`).
"""
from __future__ import annotations

from pyinfra.api import FunctionCommand, deploy, operation

from roles.gateway_api import is_server
from roles.run import config, report_dir, run_context
from roles.shell import q, sh
from voltafleet.measure import profile
from voltafleet.front.gateway import backend_host
from voltafleet.state.records import Profile
from voltafleet.state.runctx import RunDir

MAX_LINES = 200000  # the newest lines of the window, enough for a busy day of one host
SOURCES = {  # what is read on each kind of host: journalctl's selection, the lines kept
    "server": ("-u 'llama-server@*'", r"new prompt|cached n_tokens|[|] +eval time ="),
    "gateway": ("-t haproxy", r" [^ /]+/(@SERVERS@)-[0-9]+ "),  # the lines of these hosts' instances
}


def command(kind: str, hours: float, servers: list[str] = ()) -> str:
    """The host's lines of the window, newest MAX_LINES, through bash with pipefail: a journal
    that cannot be read fails the operation; no line matching is not an error (grep's 1)."""
    units, keep = SOURCES[kind]
    keep = keep.replace("@SERVERS@", "|".join(backend_host(h).replace(".", "[.]") for h in servers))
    script = (f"journalctl {units} --since=-{max(1, round(hours * 3600))}s -o short-unix --no-pager "
              f"| {{ grep -E {q(keep)} || [ $? = 1 ]; }} | tail -n {MAX_LINES}")
    return "bash -o pipefail -c " + q(script)


@operation()
def lines(kind: str, hours: float):
    """This host's log lines of the window to profile-<host>.json.

    .. code:: python

        profile.lines("server", 24)
    """
    def run(state, host):  # pyinfra passes state and host only to these two names
        # a gateway keeps the lines of the run's server hosts (the canary's) only
        servers = [h.name for h in state.inventory if is_server(h) and h in state.active_hosts]
        ok, out = sh(host, command(kind, hours, servers))
        got = out.stdout.splitlines() if ok else []
        if kind == "gateway":  # no client address, request line or team on the controller
            got = [f for f in map(profile.gateway_fields, got) if f]
        RunDir(report_dir(config())).write(Profile(
            host=host.name, run=run_context().run, kind=kind, ok=ok, lines=got,
            reason="" if ok else ((out.stderr.strip().splitlines() or ["no output"])[-1])[:300]))
        return True
    yield FunctionCommand(run, (), {})


@deploy("Profile")
def recorded(kind: str) -> None:
    """The tune's workload, recorded: this host's lines (kind: server or gateway).

    .. code:: python

        recorded("gateway")
    """
    hours = config().tune.profile_hours
    lines(name=f"The last {hours:g} h of this {kind}'s log", kind=kind, hours=hours)
