"""A gateway on this machine, from the project's own template and Lua file, in front of a CPU
llama-server of the pinned build: the proof that usage per team is exact without the lab.

Everything runs as the current user on loopback ports (VOLTAFLEET_LOCAL_PORT, default 18961,
and the next two); the configuration is templates/haproxy.cfg.j2 rendered by
voltafleet.front.gateway.template_vars, with its /etc/haproxy paths moved into a temporary folder.
A machine without haproxy, faketime, a lab-built llama-server of the pinned commit or the lab's
tiny model fails the tests (require() says which): make test installs the first two and builds
the lab before them, so the proof never passes by not running."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def pinned_server() -> str:
    """A llama-server binary of the pinned commit, as the lab built it on one of its hosts
    (VOLTAFLEET_LOCAL_LLAMA_SERVER: another one); "" when there is none."""
    import json

    from lab.fleet import STATE
    from tests.fixture_vars import PINNED_COMMIT

    if os.environ.get("VOLTAFLEET_LOCAL_LLAMA_SERVER"):
        return os.environ["VOLTAFLEET_LOCAL_LLAMA_SERVER"]
    for info in sorted(STATE.glob("hosts/*/rootfs/opt/voltafleet/releases/*/BUILD_INFO.json")):
        try:
            if json.loads(info.read_text()).get("commit") == PINNED_COMMIT and (info.parent / "bin/llama-server").exists():
                return str(info.parent / "bin/llama-server")
        except (OSError, ValueError):
            continue
    return ""


def model() -> str:
    """The lab's tiny qwen35 model in its mirror (VOLTAFLEET_LOCAL_MODEL: another one)."""
    from lab.fleet import CACHE, MODEL_NAME

    return os.environ.get("VOLTAFLEET_LOCAL_MODEL", str(CACHE / "mirror/http/models" / MODEL_NAME))


FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"  # Debian's libfaketime (make setup installs it)
BASE_PORT = int(os.environ.get("VOLTAFLEET_LOCAL_PORT", "18961"))
ALIAS = "qwen3.6-27b"


def missing_gateway() -> str | None:
    """Why the gateway alone (HAProxy, a frozen clock) cannot run here (None: it can)."""
    if not shutil.which("haproxy"):
        return "haproxy is not installed (make setup installs it)"
    if not os.path.exists(FAKETIME_LIB):
        return f"no {FAKETIME_LIB} (Debian's faketime: make setup installs it)"
    return None


def missing() -> str | None:
    """Why the local gateway cannot run here (None: it can)."""
    why = missing_gateway()
    if why:
        return why
    if not pinned_server():
        return "no llama-server of the pinned commit (the lab builds one)"
    if not os.path.exists(model()):
        return "no tiny model (the lab's mirror has one)"
    return None


def require() -> None:
    """Fail (never skip) where the local gateway cannot run: the proof must run in make test."""
    import pytest

    why = missing()
    if why:
        pytest.fail(f"tests/gateway_local cannot run: {why}", pytrace=False)


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def config(tmp: Path, keys: dict[str, str], upstream_port: int, bind_port: int, metrics_port: int,
           budgets: dict[str, dict] | None = None, tier_ports: dict[str, tuple[int, int]] | None = None,
           over: dict | None = None, pair: dict | None = None) -> str:
    """haproxy.cfg for this machine: the project's template and variables, one llama-server
    backend (16 slots, the throughput tier) and one a tier of tier_ports {tier: (port, slots)}
    (the host `<tier>`), the teams' keys {team: key} and more fields of each team's entry
    {team: {tokens_per_day: n, tier: ..., ...}}, the group variables `over`; every /etc/haproxy
    path moved under tmp, the budgets' folder to tmp/budgets."""
    import jinja2

    from tests.fixture_vars import all_yml_settings
    from voltafleet.front import budgets as budgets_mod
    from voltafleet.front import gateway, teams, tiers

    team_list = [{"name": t, "key_sha256": sha(k), **(budgets or {}).get(t, {})} for t, k in keys.items()]
    cfg = all_yml_settings(gateway_teams=team_list, gateway_bind=f"127.0.0.1:{bind_port}",
                           gateway_metrics_bind=f"127.0.0.1:{metrics_port}", server_model_alias=ALIAS,
                           server_api_key_file=None, **(over or {}))
    servers = [("local", "127.0.0.1", [upstream_port], 16)]
    servers += [(tier, "127.0.0.1", [port], slots, tier) for tier, (port, slots) in (tier_ports or {}).items()]
    backends = gateway.backends(servers)
    served = {b.tier: 1 for b in backends}
    problems = tiers.fleet_problems(teams.parse(cfg.gateway.teams), served, "harness")
    assert not problems, problems
    args = gateway.template_vars(cfg, backends, pair)
    args.update(admin_socket=str(tmp / "admin.sock"), state_file=str(tmp / "server-state"),
                errorfile=str(tmp / "503.http"))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(REPO / "templates"), trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    text = env.get_template("haproxy.cfg.j2").render(**args)
    lim = teams.limits(teams.parse(cfg.gateway.teams), 64, 100000, None)
    (tmp / "503.http").write_text(gateway.busy_page(5))
    (tmp / Path(teams.LIMITS_MAP).name).write_text(teams.limits_map(lim))
    (tmp / Path(teams.KEYS_MAP).name).write_text(teams.keys_map(teams.parse(cfg.gateway.teams)))
    (tmp / Path(teams.BUDGETS_MAP).name).write_text(teams.budgets_map(teams.parse(cfg.gateway.teams)))
    (tmp / Path(teams.TIERS_MAP).name).write_text(tiers.tiers_map(teams.parse(cfg.gateway.teams),
                                                                  cfg.gateway.tier_overflow))
    for t in gateway.tier_backends(backends)[1:]:
        (tmp / Path(t["errorfile"]).name).write_text(gateway.busy_page(cfg.gateway.retry_after_s, t["name"]))
    (tmp / "budgets").mkdir(exist_ok=True)
    text = text.replace(budgets_mod.DIR, str(tmp / "budgets"))
    shutil.copy(REPO / "roles/gateway/files/voltafleet-teams.lua", tmp / Path(teams.USAGE_LUA).name)
    # this machine: the log (which counts each request) on stdout, no haproxy user, in the foreground
    text = text.replace("/etc/haproxy/", f"{tmp}/").replace("log /dev/log local0", "log stdout format raw local0")
    drop = ("    user haproxy", "    group haproxy", "    daemon", "    load-server-state-from-file")
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(drop))


def wait_http(url: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(url)
        time.sleep(0.2)


class Local:
    """llama-server (16 slots, room for long answers) and the gateway in front of it; with tiers
    {tier: slots}, one more llama-server a tier (ports BASE_PORT + 3 on), each its tier's backend."""

    def __init__(self, tmp: Path, keys: dict[str, str], slots: int = 16, ctx_per_slot: int = 4096,
                 budgets: dict[str, dict] | None = None, tiers: dict[str, int] | None = None,
                 over: dict | None = None, threads: int | None = None, pair: dict | None = None,
                 gw_ports: tuple[int, int] | None = None):
        self.tmp, self.keys, self.slots, self.ctx, self.budgets = tmp, keys, slots, ctx_per_slot, budgets
        self.server_port, self.gw_port, self.metrics_port = BASE_PORT, BASE_PORT + 1, BASE_PORT + 2
        if gw_ports:  # a second gateway in front of the same server (a pair: `pair`, its part of it)
            self.gw_port, self.metrics_port = gw_ports
        self.pair = pair
        self.tier_ports = {t: (BASE_PORT + 3 + i, n) for i, (t, n) in enumerate((tiers or {}).items())}
        self.over, self.threads = over, threads  # threads: each server's -t (None: llama-server's default)
        self.procs: list[subprocess.Popen] = []
        self.clock: str | None = None  # HAProxy's clock started at this UTC time (libfaketime's '@<clock>'), else the real one

    def tier_direct(self, tier: str) -> str:
        """A tier's own llama-server, not through the gateway."""
        return f"http://127.0.0.1:{self.tier_ports[tier][0]}"

    @property
    def direct(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"

    @property
    def gateway(self) -> str:
        return f"http://127.0.0.1:{self.gw_port}"

    @property
    def metrics(self) -> str:
        from voltafleet.front import teams
        return f"http://127.0.0.1:{self.metrics_port}{teams.METRICS_PATH}"

    def start(self) -> "Local":
        self.start_servers()
        return self.start_gateway()

    def start_servers(self) -> None:
        binary = pinned_server()
        lib = str(Path(binary).parents[1] / "lib")
        env = {**os.environ, "LD_LIBRARY_PATH": lib + ":" + os.environ.get("LD_LIBRARY_PATH", "")}
        for name, port, slots in [("", self.server_port, self.slots)] + [(f"-{t}", p, n) for t, (p, n) in self.tier_ports.items()]:
            self.procs.append(subprocess.Popen(
                [binary, "-m", model(), "--host", "127.0.0.1", "--port", str(port), "--alias", ALIAS,
                 "-c", str(slots * self.ctx), "-np", str(slots), "--no-webui", "--metrics"]
                + (["-t", str(self.threads)] if self.threads else []),
                stdout=open(self.tmp / f"llama-server{name}.log", "wb"), stderr=subprocess.STDOUT, env=env))
        for port in [self.server_port] + [p for p, _ in self.tier_ports.values()]:
            wait_http(f"http://127.0.0.1:{port}/health", 120)
        self.alive("llama-server")

    def start_gateway(self) -> "Local":
        cfg = self.tmp / "haproxy.cfg"
        cfg.write_text(config(self.tmp, self.keys, self.server_port, self.gw_port, self.metrics_port, self.budgets,
                              self.tier_ports, self.over, self.pair))
        subprocess.run(["haproxy", "-c", "-q", "-f", str(cfg)], check=True)
        self.start_haproxy()
        return self

    def start_haproxy(self, budgets: bool = True) -> None:
        """HAProxy in master-worker mode (as systemd runs it), in the foreground."""
        # a frozen clock: libfaketime preloaded into HAProxy itself (the faketime wrapper would fork it as its
        # child, and a stop would end the wrapper alone)
        clock = {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": f"@{self.clock}"} if self.clock else {}
        self.haproxy = subprocess.Popen(["haproxy", "-W", "-db", "-f", str(self.tmp / "haproxy.cfg")], env={**os.environ, **clock},
                                        stdout=open(self.tmp / "haproxy.log", "ab"), stderr=subprocess.STDOUT)
        self.procs.append(self.haproxy)
        wait_http(self.metrics, 30)
        if budgets:
            self.wait_budgets()
        self.alive("haproxy")

    def wait_budgets(self, seconds: float = 30) -> None:
        """Until the current worker's task has read the budgets' day files (its gauge says 1)."""
        deadline = time.monotonic() + seconds
        while "voltafleet_gateway_budgets_ready 0" in httpx.get(self.metrics, timeout=10).text:
            if time.monotonic() > deadline:
                raise TimeoutError("the gateway's budgets were never loaded")
            time.sleep(0.05)

    def team_counters(self, team: str) -> dict[str, float]:
        """The gateway's counters of one team (voltafleet_team_<name>{team="<team>"}), by name."""
        import re

        text = httpx.get(self.metrics, timeout=10).text
        return {m: float(v) for m, v in re.findall(r'^voltafleet_team_(\w+)\{team="%s"\} (\S+)$' % team, text, re.M)}

    def admin(self, command: str) -> str:
        """One command on HAProxy's admin socket (the runtime API), its answer."""
        import socket

        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.tmp / "admin.sock"))
            s.sendall(command.encode() + b"\n")
            return b"".join(iter(lambda: s.recv(65536), b"")).decode()

    def worker_pid(self) -> int:
        """The pid of HAProxy's current worker (`show info` on the admin socket)."""
        import re

        return int(re.search(r"^Pid: (\d+)$", self.admin("show info"), re.M).group(1))

    def reload(self) -> int:
        """`systemctl reload haproxy`'s signal (SIGUSR2 to the master): a new worker with a fresh Lua
        state, while the old one finishes its streams. Returns the new worker's pid."""
        import signal

        old = self.worker_pid()
        self.haproxy.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                pid = self.worker_pid()
            except (OSError, AttributeError):
                continue
            if pid != old:
                wait_http(self.metrics, 30)
                self.wait_budgets()
                return pid
        raise TimeoutError("no new HAProxy worker after SIGUSR2")

    def restart(self, budgets: bool = True) -> None:
        """HAProxy stopped (its worker gone) and started again (budgets: until its budgets are loaded)."""
        self.haproxy.terminate()
        self.haproxy.wait(30)
        self.procs.remove(self.haproxy)
        self.start_haproxy(budgets)

    def alive(self, what: str) -> None:
        """Each process started is still running: another one on its port answered otherwise."""
        time.sleep(0.5)
        if any(p.poll() is not None for p in self.procs):
            self.stop()
            raise RuntimeError(f"{what} exited (a port of {BASE_PORT}-{BASE_PORT + 2 + len(self.tier_ports)} in use?): "
                               f"see {self.tmp}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


class Faked(Local):
    """The gateway in front of a stand-in upstream instead of llama-server (a small HTTP/1.1 server on
    the server's port): GET answers {"status":"ok"}, POST answers answer(<its x-fake header, "ok">) ->
    (content type, body) or (content type, body, seconds): the body's last byte sent that many seconds
    after the rest. For what the real server never does (a malformed answer) and for measuring the
    gateway alone."""

    def __init__(self, *args, answer=None, **kw):
        super().__init__(*args, **kw)
        self.answer = answer

    def start_servers(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        answer = self.answer

        class Upstream(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def reply(self, ctype: str, body: bytes, last_after_s: float = 0) -> None:
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if last_after_s:
                    self.wfile.write(body[:-1])
                    self.wfile.flush()
                    time.sleep(last_after_s)
                    body = body[-1:]
                self.wfile.write(body)

            def do_GET(self):
                self.reply("application/json", b'{"status":"ok"}')

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self.reply(*answer(self.headers.get("x-fake", "ok")))

        self.upstream = ThreadingHTTPServer(("127.0.0.1", self.server_port), Upstream)
        threading.Thread(target=self.upstream.serve_forever, daemon=True).start()

    def stop(self) -> None:
        super().stop()
        if getattr(self, "upstream", None):
            self.upstream.shutdown()
            self.upstream.server_close()
            self.upstream = None
