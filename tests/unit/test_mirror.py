"""The model mirror's pure logic (voltafleet/models/mirror.py), its variables' checks and its nginx
template: rendered with jinja2, checked by the local nginx (`nginx -t`) where there is one,
and served for real: a cold fetch reaches the upstream once, a second fetch, a Range and a
resumed download come from the cache, and a redirecting upstream (Hugging Face's 302 to its
CDN) is followed behind the cache."""
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jinja2
import pytest
import yaml

from tests.fixture_vars import all_yml_vars, prod_host_vars
from voltafleet.models import mirror
from voltafleet.inputs.config import ConfigError, validate_values
from voltafleet.state.fleetplan import FleetPlan, with_servers
from voltafleet.inputs.groupvars import build_inventory
from voltafleet.inputs.settings import Settings

REPO = Path(__file__).resolve().parents[2]
HF = "https://huggingface.co/unsloth/Qwen3.6-27B-GGUF/resolve/main/Qwen3.6-27B-Q4_K_S.gguf"
M1 = mirror.Mirror("mirror-1", "10.0.0.5", 8880, "https://huggingface.co")
M2 = mirror.Mirror("mirror-2", "10.0.0.6", 8880, "https://huggingface.co")
M3 = mirror.Mirror("mirror-3", "fd00::7", 8880, "https://huggingface.co")


# ---------------------------------------------------------------- pure logic


def test_origin_is_scheme_and_host_without_the_default_port():
    assert mirror.origin(HF) == "https://huggingface.co"
    assert mirror.origin("HTTPS://HuggingFace.co:443/x.gguf") == "https://huggingface.co"
    assert mirror.origin("http://127.0.0.1:8808/models/a.gguf") == "http://127.0.0.1:8808"
    assert mirror.origin("http://[fd00::1]:80/a.gguf") == "http://[fd00::1]"


def test_fetch_url_keeps_path_and_query_and_brackets_ipv6():
    assert mirror.fetch_url(HF, "gpu-01", [M1]) == \
        "http://10.0.0.5:8880/unsloth/Qwen3.6-27B-GGUF/resolve/main/Qwen3.6-27B-Q4_K_S.gguf"
    assert mirror.fetch_url(HF + "?download=true", "gpu-01", [M3]).startswith("http://[fd00::7]:8880/unsloth/")
    assert mirror.fetch_url(HF + "?download=true", "gpu-01", [M3]).endswith(".gguf?download=true")


def test_no_mirror_or_another_origin_fetches_the_url_itself():
    assert mirror.fetch_url(HF, "gpu-01", []) == HF
    assert mirror.fetch_url("https://example.org/m.gguf", "gpu-01", [M1, M2]) == "https://example.org/m.gguf"


def test_each_host_always_picks_the_same_mirror_and_the_fleet_spreads():
    hosts = [f"gpu16-{n:03d}.fleet.internal" for n in range(300)]
    three = [M1, M2, M3]
    first = {h: mirror.pick(h, three) for h in hosts}
    assert first == {h: mirror.pick(h, list(reversed(three))) for h in hosts}  # not the inventory's order
    share = {m: sum(1 for v in first.values() if v == m) for m in three}
    assert all(60 <= n <= 140 for n in share.values()), share
    # a mirror gone: only its own hosts move (rendezvous hashing), the others keep their cache
    two = {h: mirror.pick(h, [M1, M2]) for h in hosts}
    assert all(two[h] == first[h] for h in hosts if first[h] != M3)
    with pytest.raises(ValueError):
        mirror.pick("gpu-01", [])


def test_a_mirror_is_reached_at_mirror_address_else_ssh_hostname_else_its_name():
    base = {**prod_host_vars(), "mirror_port": 8880, "model_url": HF}
    assert mirror.mirror_of("m1", Settings.of({**base, "mirror_address": "10.1.1.1"}), "127.0.0.1").address == "10.1.1.1"
    assert mirror.mirror_of("m1", Settings.of({**base, "mirror_address": None}), "127.0.0.1").address == "127.0.0.1"
    assert mirror.mirror_of("m1.fleet", Settings.of({**base, "mirror_address": None})) == \
        mirror.Mirror("m1.fleet", "m1.fleet", 8880, "https://huggingface.co")


def test_resolvers_from_resolv_conf():
    assert mirror.resolvers(["# x", "nameserver 127.0.0.53", "nameserver ::1", "nameserver fe80::1%eth0",
                             "nameserver bogus", "options edns0"]) == ["127.0.0.53", "[::1]"]


def test_the_fleet_plan_carries_the_mirrors():
    plan = FleetPlan("r1", mirrors=(M1, M3))
    again = FleetPlan.from_json(plan.to_json())
    assert again.mirrors == (M1, M3)
    assert with_servers(again, []).mirrors == (M1, M3)
    assert FleetPlan.from_json('{"rollout": "old"}').mirrors == ()  # a plan written before mirrors


# ---------------------------------------------------------------- variables


def test_every_mirror_variable_has_a_default_and_validates():
    cfg = prod_host_vars()
    assert {k for k in cfg if k.startswith("mirror_")} == {
        "mirror_port", "mirror_listen", "mirror_address", "mirror_cache_dir", "mirror_cache_max_gb",
        "mirror_slice_mb", "mirror_cache_valid_days", "mirror_lock_timeout_s", "mirror_extra_paths"}
    assert validate_values("m1", cfg)["mirror_port"] == 8880


@pytest.mark.parametrize("key,value,message", [
    ("mirror_port", 8000, r"mirror_port: is 8000, the port of gateway_bind \(0\.0\.0\.0:8000\).*\n  Fix: set "
                          r"mirror_port to a free port, e\.g\. 8001"),
    ("mirror_port", 8404, r"mirror_port: is 8404, the port of gateway_metrics_bind"),
    ("mirror_port", 0, r"mirror_port: is 0, below the minimum 1\.\n  Fix: set 1 or more"),
    ("mirror_slice_mb", 0, r"mirror_slice_mb: is 0, below the minimum 1"),
    ("mirror_slice_mb", "16m", r"mirror_slice_mb: is '16m' \(str\)\.\n  Fix: give an integer"),
    ("mirror_cache_max_gb", 0, r"mirror_cache_max_gb: is 0, below the minimum 1"),
    ("mirror_cache_dir", "/var", r"mirror_cache_dir: is '/var': the mirror role makes it nginx's own.*\n  Fix: give a "
                                 r"directory of its own, e\.g\. /var/cache/voltafleet-mirror"),
    ("mirror_cache_dir", "cache", r"mirror_cache_dir: is 'cache', not an absolute path"),
    ("mirror_listen", "0.0.0.0; evil", r"mirror_listen: is '0\.0\.0\.0; evil', not an IP address or a host name"),
    ("mirror_address", "http://m1", r"mirror_address: is 'http://m1', not an IP address or a host name"),
])
def test_bad_mirror_values_name_the_file_the_key_and_the_fix(tmp_path, key, value, message):
    gv = tmp_path / "group_vars"
    gv.mkdir()
    (gv / "all.yml").write_text(yaml.safe_dump({**all_yml_vars(), "model_sha256": "a" * 64}))
    (gv / "mirror.yml").write_text(yaml.safe_dump({key: value}))
    with pytest.raises(ConfigError) as e:
        build_inventory({"mirror": ["m1"]}, origin="inventory/test.py", group_vars=gv)
    assert "group_vars/mirror.yml" in str(e.value) or f"{gv}/mirror.yml" in str(e.value)
    assert re.search(message, str(e.value)), str(e.value)


# ---------------------------------------------------------------- the nginx template


def render(cfg: dict | None = None, nameservers=("10.0.0.53",), **over) -> str:
    cfg = Settings.of({**prod_host_vars(), **(cfg or {})})
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(REPO / "templates")), trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    return env.get_template("nginx-mirror.conf.j2").render(**{**mirror.nginx_vars(cfg, list(nameservers)), **over})


def test_the_template_caches_slices_keyed_by_url_and_range():
    text = render()
    for line in ("proxy_cache_path /var/cache/voltafleet-mirror levels=1:2 keys_zone=voltafleet_mirror:16m "
                 "max_size=100g inactive=30d use_temp_path=off;",
                 "slice 16m;", "proxy_cache_key $uri$is_args$args$slice_range;", "proxy_set_header Range $slice_range;",
                 "proxy_cache_valid 200 206 30d;", "proxy_cache_lock on;", "proxy_cache_lock_timeout 120s;",
                 "listen 0.0.0.0:8880;", "listen unix:/run/nginx-voltafleet-mirror.sock;",
                 "proxy_pass http://unix:/run/nginx-voltafleet-mirror.sock:;",
                 "set $voltafleet_upstream https://huggingface.co;", "resolver 10.0.0.53 valid=300s;",
                 "proxy_ssl_server_name on;", "proxy_ssl_verify on;",
                 "error_page 301 302 303 307 308 = @voltafleet_redirect;"):
        assert line in text, line
    small = render({"mirror_slice_mb": 4, "mirror_cache_max_gb": 40, "mirror_port": 3128, "mirror_listen": "10.0.0.5"})
    assert "slice 4m;" in small and "max_size=40g" in small and "listen 10.0.0.5:3128;" in small
    # no nameserver: the upstream is resolved when nginx loads the configuration
    assert "proxy_pass https://huggingface.co;" in render(nameservers=()) and "resolver " not in render(nameservers=())


def test_the_upstream_is_model_urls_origin():
    text = render({"model_url": "http://127.0.0.1:8808/models/tiny-qwen35.gguf"}, nameservers=())
    assert "proxy_pass http://127.0.0.1:8808;" in text and "~^/ http://127.0.0.1:8808$upstream_http_location;" in text


NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
needs_nginx = pytest.mark.skipif(NGINX is None, reason="no nginx here")


def nginx_prefix(tmp: Path, body: str) -> Path:
    """A main configuration of nginx's own under tmp (pid, logs, temp paths) including `body`."""
    (tmp / "tmp").mkdir(exist_ok=True)
    (tmp / "mirror.conf").write_text(body)
    conf = tmp / "nginx.conf"
    # user root: pytest's tmp directory is root's own (0700); a non-root nginx ignores it, with a warning
    conf.write_text(f"""{"user root;" if os.geteuid() == 0 else ""}
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log info;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/tmp; proxy_temp_path {tmp}/tmp; fastcgi_temp_path {tmp}/tmp;
    uwsgi_temp_path {tmp}/tmp; scgi_temp_path {tmp}/tmp;
    include {tmp}/mirror.conf;
}}
""")
    return conf


def local(tmp: Path, port: int, upstream: str, nameservers=(), allow=None) -> str:
    # the model and (as the draft model) the redirecting path: the mirror proxies these two paths only
    cfg = {"model_url": f"{upstream}/models/m.gguf", "model_draft_url": f"{upstream}/redir/m.gguf",
           "mirror_listen": "127.0.0.1", "mirror_port": port,
           "mirror_cache_dir": str(tmp / "cache"), "mirror_slice_mb": 1}
    return render(cfg, nameservers=nameservers, socket=str(tmp / "inner.sock"), access_log=str(tmp / "mirror.log"),
                  allow=allow or [])


@needs_nginx
@pytest.mark.parametrize("upstream,nameservers", [
    ("http://127.0.0.1:19511", ()), ("https://127.0.0.1:19511", ()), ("https://huggingface.co", ("10.0.0.53",))])
def test_nginx_accepts_the_configuration(tmp_path, upstream, nameservers):
    """Debian 12's nginx has the slice module built in: `nginx -t` knows every directive."""
    conf = nginx_prefix(tmp_path, local(tmp_path, 19510, upstream, nameservers))
    r = subprocess.run([NGINX, "-t", "-p", str(tmp_path), "-c", str(conf)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- served for real


class Upstream(BaseHTTPRequestHandler):
    """/models/NAME with Range (206), /redir/NAME: 302 to /blob/NAME?sig=..., like Hugging Face."""
    protocol_version = "HTTP/1.1"
    files: dict = {}
    served: list = []
    agents: set = set()

    def log_message(self, *a):
        pass

    def do_GET(self):
        path = self.path.split("?")[0]
        name = path.rsplit("/", 1)[-1]
        if path.startswith("/redir/"):
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/blob/{name}?sig=x")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = self.files.get(name)
        if data is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start, end = 0, len(data) - 1
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if m:
            start, end = int(m.group(1)), min(int(m.group(2) or end), end)
        self.send_response(206 if m else 200)
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("ETag", '"v1"')
        self.send_header("Cache-Control", "private, max-age=0")  # ignored by the mirror
        if m:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        self.wfile.write(data[start:end + 1])
        self.served.append((self.path, end - start + 1))
        self.agents.add(self.headers.get("User-Agent"))


def free_port(lo: int, hi: int) -> int:
    for port in range(lo, hi):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return port
    pytest.skip(f"no free port in {lo}-{hi}")


def curl(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "-fsS", *args], capture_output=True, timeout=30)


@needs_nginx
@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl here")
def test_the_upstream_sends_the_bytes_once(tmp_path):
    data = os.urandom(3 * (1 << 20) + 12345)  # four 1 MiB slices
    Upstream.files, Upstream.served = {"m.gguf": data}, []
    up = ThreadingHTTPServer(("127.0.0.1", free_port(19520, 19530)), Upstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    port = free_port(19500, 19510)
    conf = nginx_prefix(tmp_path, local(tmp_path, port, f"http://127.0.0.1:{up.server_port}"))
    subprocess.run([NGINX, "-p", str(tmp_path), "-c", str(conf)], check=True)
    try:
        deadline = time.time() + 10
        while not (tmp_path / "nginx.pid").exists() and time.time() < deadline:
            time.sleep(0.1)
        base = f"http://127.0.0.1:{port}"
        sha = hashlib.sha256(data).hexdigest()
        for _ in range(2):
            assert hashlib.sha256(curl(f"{base}/models/m.gguf").stdout).hexdigest() == sha
        assert sum(n for _, n in Upstream.served) == len(data)  # once, in slices
        assert {a.split("/")[0] for a in Upstream.agents} == {"curl"}  # the client's User-Agent, passed on
        assert curl("-r", "1500000-2600000", f"{base}/models/m.gguf").stdout == data[1500000:2600001]
        part = tmp_path / "part"
        part.write_bytes(data[:1234567])
        assert curl("-C", "-", "-o", str(part), f"{base}/models/m.gguf").returncode == 0
        assert part.read_bytes() == data
        assert sum(n for _, n in Upstream.served) == len(data)  # Range and resume: from the cache
        Upstream.served.clear()
        assert hashlib.sha256(curl(f"{base}/redir/m.gguf").stdout).hexdigest() == sha
        assert {p for p, _ in Upstream.served} == {"/blob/m.gguf?sig=x"}  # followed behind the cache
        assert curl(f"{base}/redir/m.gguf").returncode == 0 and sum(n for _, n in Upstream.served) == len(data)
        assert subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", f"{base}/models/none.gguf"],
                              capture_output=True, text=True).stdout == "404"
        # a path the origin serves but no configured model names: 404 at the mirror, the origin never asked
        Upstream.files["other.gguf"], Upstream.served = b"secret", []
        assert subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", f"{base}/models/other.gguf"],
                              capture_output=True, text=True).stdout == "404"
        assert Upstream.served == []
    finally:
        subprocess.run([NGINX, "-p", str(tmp_path), "-c", str(conf), "-s", "stop"], capture_output=True)
        up.shutdown()
        up.server_close()


def test_only_the_server_hosts_addresses_fetch_when_they_are_known():
    assert mirror.allow_list(["10.0.0.7", "10.0.0.5", "10.0.0.7", "::1"]) == ["10.0.0.5", "10.0.0.7", "::1"]
    assert mirror.allow_list(["10.0.0.5", "gpu-02.example"]) is None  # a name: nginx allows addresses only
    assert mirror.allow_list([]) is None
    text = render(allow=["10.0.0.5", "10.0.0.7"])
    assert "    allow 10.0.0.5;\n    allow 10.0.0.7;\n    deny all;" in text
    assert "    deny all;" not in render() and "allow " not in render()


@needs_nginx
def test_an_address_outside_the_fleet_is_refused(tmp_path):
    Upstream.files, Upstream.served = {"m.gguf": b"x" * 1000}, []
    up = ThreadingHTTPServer(("127.0.0.1", free_port(19540, 19550)), Upstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    port = free_port(19550, 19560)
    code = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", f"http://127.0.0.1:{port}/models/m.gguf"]
    for allow, want in ((["127.0.0.2"], "403"), (["127.0.0.1"], "200")):
        conf = nginx_prefix(tmp_path, local(tmp_path, port, f"http://127.0.0.1:{up.server_port}", allow=allow))
        subprocess.run([NGINX, "-p", str(tmp_path), "-c", str(conf)], check=True)
        try:
            deadline = time.time() + 10
            while not (tmp_path / "nginx.pid").exists() and time.time() < deadline:
                time.sleep(0.1)
            assert subprocess.run(code, capture_output=True, text=True).stdout == want, allow
        finally:
            subprocess.run([NGINX, "-p", str(tmp_path), "-c", str(conf), "-s", "stop"], capture_output=True)
            deadline = time.time() + 10
            while (tmp_path / "nginx.pid").exists() and time.time() < deadline:
                time.sleep(0.1)
    assert Upstream.served and all(p == "/models/m.gguf" for p, _ in Upstream.served)  # only the allowed one fetched
    up.shutdown()
    up.server_close()


# ---------------------------------------------------------------- the lab inventory


def lab_inventory(tmp_path, mirror_env: str | None, gateway: bool = True):
    """inventory/lab.py on a made-up lab state (VOLTAFLEET_LAB): {group: [(host, data)]} or the error."""
    state = tmp_path / "lab"
    state.mkdir(exist_ok=True)
    hosts = [{"name": f"vf-lab-{i}", "address": "127.0.0.1", "ssh_port": 2200 + i, "server_port_base": 18000 + 10 * i}
             for i in (1, 2, 3)]
    gws = [{"name": n, "address": a, "ssh_port": p, "metrics": f"{a}:18404"}
           for n, a, p in (("vf-lab-gw", "10.231.0.11", 2209), ("vf-lab-gw2", "10.231.0.12", 2208))] if gateway else []
    (state / "lab.json").write_text(json.dumps({
        "hosts": hosts, "gateway": gws[0] if gws else None, "gateways": gws,
        "ssh_key": "/k", "known_hosts": "/kh", "llama_cpp_repo": "git://127.0.0.1:9418/llama.cpp.git",
        "llama_cpp_ref": "c" * 40, "model_url": "http://10.231.0.1:8808/models/tiny-qwen35.gguf",
        "model_sha256": "b" * 64}))
    env = {k: v for k, v in os.environ.items() if k not in ("VOLTAFLEET_LAB_MIRROR", "VOLTAFLEET_VARS",
                                                            "VOLTAFLEET_LAB_HOST_VARS")}
    env["VOLTAFLEET_LAB"] = str(state)
    if mirror_env is not None:
        env["VOLTAFLEET_LAB_MIRROR"] = mirror_env
    code = ("import json, runpy; a = runpy.run_path('inventory/lab.py'); "
            "print(json.dumps({k: v for k, v in a.items() if k in ('lab', 'gateway', 'mirror')}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout) if r.returncode == 0 else r.stderr


def test_the_lab_gateway_is_the_mirror_when_asked(tmp_path):
    from lab import fleet

    plain = lab_inventory(tmp_path, None)
    assert sorted(plain) == ["gateway", "lab"]
    groups = lab_inventory(tmp_path, "1")
    assert [h for h, _ in groups["mirror"]] == ["vf-lab-gw"]
    assert [h for h, _ in groups["gateway"]] == ["vf-lab-gw", "vf-lab-gw2"]  # the pair, the first also the mirror
    assert [h for h, _ in groups["lab"]] == ["vf-lab-1", "vf-lab-2", "vf-lab-3"]
    gw2 = dict(groups["gateway"])["vf-lab-gw2"]
    assert (gw2["gateway_address"], gw2["gateway_metrics_bind"], gw2["mirror_listen"]) == \
        ("10.231.0.12", "10.231.0.12:18404", "10.231.0.12")  # each on its own address on the bridge
    mirrors = mirror.mirrors_of([(h, Settings.of(d), d.get("ssh_hostname")) for h, d in groups["mirror"]])
    assert mirrors == (mirror.Mirror("vf-lab-gw", "10.231.0.11", fleet.MIRROR_PORT, "http://10.231.0.1:8808"),)
    assert mirror.fetch_url("http://10.231.0.1:8808/models/tiny-qwen35.gguf", "vf-lab-1", mirrors) == \
        f"http://10.231.0.11:{fleet.MIRROR_PORT}/models/tiny-qwen35.gguf"
    assert "Fix: run `python -m lab up --gateway`" in lab_inventory(tmp_path, "1", gateway=False)
