"""The model mirror on the lab fleet: with VOLTAFLEET_LAB_MIRROR=1 (these tests set it for their
own runs) the gateway host vf-lab-gw is also the `mirror` group, Debian's nginx caching the lab's
model mirror (the controller's nginx on the lab's bridge, 10.231.0.1:8808) on its own address's port 18808 in 1 MiB pieces
(group_vars/lab.yml). Every server host fetches the model through it: the controller's access
log shows the file's bytes sent once however many hosts fetch it; a download cut half way still
resumes through the cache; a wrong sha256 is still refused on the server host.

Needs `python -m lab up --hosts 3 --gateway`; the gateway host installs nginx from Debian's
archive (as it installs HAProxy)."""
import math
import re

import pytest

from lab.fleet import BRIDGE_ADDR, GATEWAY_INDEXES, MIRROR_PORT, STATE, gateway_address
from tests.lab.helpers import MIRROR, deploy, lab, ssh, still, th

AT = f"{gateway_address(GATEWAY_INDEXES[0])}:{MIRROR_PORT}"  # the first gateway's own address on the bridge
BASE = f"http://{AT}"
SLICE = 1 << 20  # group_vars/lab.yml's mirror_slice_mb
CACHE = "/var/cache/voltafleet-mirror"  # group_vars/all.yml's mirror_cache_dir
FETCH = "/opt/voltafleet/bin/vf-fetch-model"  # the model role's own script, as installed on a converged host
TEST_DIR = "/var/tmp/vf-mirror-test"
MODELS = "/var/lib/voltafleet/models-mirror-test"


def log_mark() -> int:
    return (STATE / "nginx-access.log").stat().st_size


def upstream_sent(mark: int, path: str) -> list[tuple[int, int]]:
    """(status, bytes) of every GET of `path` the controller's model mirror answered since mark
    for curl (the hosts' vf-fetch-model; through the cache its User-Agent is passed on), not the
    controller's own header reads and HEADs (Python-urllib)."""
    with open(STATE / "nginx-access.log") as f:
        f.seek(mark)
        lines = f.read().splitlines()
    out = []
    for line in lines:  # nginx's combined format
        m = re.search(r'"GET (\S+) HTTP/[\d.]+" (\d{3}) (\d+) "[^"]*" "([^"]*)"', line)
        if m and m.group(1).split("?")[0] == path and m.group(4).startswith("curl/"):
            out.append((int(m.group(2)), int(m.group(3))))
    return out


def model_name() -> str:
    return lab()["model_url"].rsplit("/", 1)[1]


def clear_cache(gw) -> None:
    ssh(gw, f"systemctl stop nginx && find {CACHE} -mindepth 1 -delete && systemctl start nginx")


def absent(host, path: str) -> bool:
    return ssh(host, f"test -e {path} && echo yes || echo no") == "no"


@pytest.fixture(scope="module")
def mirror_host(first_rollout):
    """The gateway host, whose nginx (the model mirror) is stopped after this file's tests: its
    port on this machine's loopback is free again."""
    gw = lab().get("gateway")
    assert gw and len(lab()["hosts"]) >= 3, "the mirror tests need `python -m lab up --hosts 3 --gateway`"
    yield gw
    ssh(gw, "systemctl disable --now nginx", check=False)


@pytest.fixture
def mirrored(mirror_host):
    """The fleet rolled out with vf-lab-gw as its model mirror too, the mirror's cache empty. The
    deploy is skipped when every host still shows what it showed after the last mirrored deploy
    that succeeded (each test here ends with one) and the mirror is serving."""
    gw, three = mirror_host, lab()["hosts"][:3]
    if not still("mirror") or ssh(gw, "systemctl is-active nginx", check=False) != "active":
        run = deploy(env=MIRROR)
        assert run.rc == 0, run
    clear_cache(gw)
    ssh(three[0], f"rm -rf {TEST_DIR}")
    return three, gw


def test_the_mirror_is_debians_nginx_with_slices_and_a_second_run_changes_nothing(mirrored):
    hosts, gw = mirrored
    assert th(gw).service("nginx").is_running and th(gw).service("nginx").is_enabled
    assert "--with-http_slice_module" in ssh(gw, "nginx -V 2>&1")
    conf = ssh(gw, "cat /etc/nginx/conf.d/voltafleet-mirror.conf")
    for line in (f"listen {AT};", "slice 1m;", "proxy_cache_key $uri$is_args$args$slice_range;",
                 "proxy_cache_lock on;", f"~^/ http://{BRIDGE_ADDR}:8808$upstream_http_location;"):
        assert line in conf, line
    assert absent(gw, "/etc/nginx/sites-enabled/default")  # Debian's welcome page (port 80) is off
    assert ssh(hosts[0], f"curl -s -o /dev/null -w '%{{http_code}}' -r 0-99 {BASE}/models/{model_name()}") == "206"
    run = deploy(env=MIRROR)
    assert run.rc == 0 and run.changed == 0, run  # idempotent, the mirror included


def test_every_host_fetches_the_model_through_the_cache_and_the_upstream_sends_it_once(mirrored, tmp_path):
    hosts, gw = mirrored
    st, every = lab(), lab()["hosts"]
    path = f"/models/{model_name()}"
    dest = f"{MODELS}/{st['model_sha256'][:16]}/{model_name()}"
    mark = log_mark()
    try:
        # a model_dir of their own: every host fetches the model again, at once (one pyinfra operation)
        run = deploy({"model_dir": MODELS}, tmp_path, env=MIRROR)
        assert run.rc == 0, run
        assert f"(through {AT})" in run.out
        for h in every:
            assert ssh(h, f"sha256sum < {dest} | cut -d' ' -f1") == st["model_sha256"], h["name"]
            assert ssh(h, f"cut -d' ' -f1 {dest}.verified") == st["model_sha256"]
            assert ssh(h, f"grep -q -- '-m {dest}' /etc/voltafleet/llama-server/0.env && echo yes") == "yes"
        sent = upstream_sent(mark, path)
        # the mirror's pieces, each once: never a whole file to a host, never a piece twice
        assert sent and {status for status, _ in sent} == {206}, sent
        assert sum(n for _, n in sent) == st["model_size"], (sent, len(every))
        assert len(sent) == math.ceil(st["model_size"] / SLICE)
        assert ssh(gw, f"grep -c 'GET {path} ' /var/log/nginx/voltafleet-mirror.log") != "0"
    finally:
        assert deploy(env=MIRROR).rc == 0  # back to the fleet's model_dir (its model kept, verified)
        for h in every:
            ssh(h, f"rm -rf {MODELS}")


def test_a_download_cut_half_way_resumes_through_the_cache(mirrored, tmp_path):
    hosts, gw = mirrored
    h, st = hosts[0], lab()
    path = f"/slow/models/{model_name()}"  # the controller's mirror sends these at 2 MB/s
    # not a configured model's path: the mirror answers 404 until it is one of mirror_extra_paths
    assert ssh(h, f"curl -s -o /dev/null -w '%{{http_code}}' {BASE}{path}") == "404"
    assert deploy({"mirror_extra_paths": [path]}, tmp_path, env=MIRROR).rc == 0
    dest = f"{TEST_DIR}/model.gguf"
    mark = log_mark()
    r = th(h).run(f"timeout 3 {FETCH} {BASE}{path} {dest} {st['model_sha256']}")
    assert r.rc == 124  # killed mid-transfer
    part = int(ssh(h, f"stat -c %s {dest}.part"))
    assert 0 < part < st["model_size"]
    assert absent(h, dest)
    r = th(h).run(f"{FETCH} {BASE}{path} {dest} {st['model_sha256']}")
    assert r.rc == 0, r.stderr
    assert ssh(h, f"sha256sum < {dest} | cut -d' ' -f1") == st["model_sha256"]
    assert absent(h, f"{dest}.part")
    resumed = [line for line in ssh(gw, "cat /var/log/nginx/voltafleet-mirror.log").splitlines()
               if f"GET {path} " in line and '" 206 ' in line]
    assert resumed  # the resume was a Range request, answered from the pieces
    sent = upstream_sent(mark, path)
    # the pieces cached before the cut are not fetched again: at most the one in flight comes twice
    assert {status for status, _ in sent} == {206}, sent
    assert st["model_size"] <= sum(n for _, n in sent) <= st["model_size"] + SLICE, sent


def test_a_wrong_sha256_is_still_refused_through_the_cache(mirrored, tmp_path):
    hosts, gw = mirrored
    h = hosts[1]
    ssh(h, f"rm -rf {TEST_DIR}")
    url = f"{BASE}/models/{model_name()}"
    r = th(h).run(f"{FETCH} {url} {TEST_DIR}/bad.gguf {'0' * 64}")
    assert r.rc == 1
    assert "model_sha256 says 0000" in r.stderr and f"(from {url})" in r.stderr and "untouched" in r.stderr
    assert absent(h, f"{TEST_DIR}/bad.gguf") and absent(h, f"{TEST_DIR}/bad.gguf.part")
    r = th(h).run(f"{FETCH} {BASE}/models/missing.gguf {TEST_DIR}/missing.gguf {'1' * 64}")
    assert r.rc == 1 and "failed (curl exit 22)" in r.stderr  # the upstream's 404, passed on
    # the model role itself: a model_sha256 the file does not have is refused on every host, nothing switched
    before = {x["name"]: ssh(x, "cat /etc/voltafleet/llama-server/0.env") for x in lab()["hosts"]}
    try:
        run = deploy({"model_sha256": "0" * 64, "smoke_probe": False}, tmp_path, env=MIRROR)
        assert run.rc != 0 and "sha256 of the download is" in run.out and f"(from {url})" in run.out, run
        assert {x["name"]: ssh(x, "cat /etc/voltafleet/llama-server/0.env") for x in lab()["hosts"]} == before
        assert ssh(h, "ls /var/lib/voltafleet/models/*/*.part 2>/dev/null || true") == ""
    finally:
        assert deploy(env=MIRROR).rc == 0
