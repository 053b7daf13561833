"""Inputs that cannot hurt (issue 13): URL, git and ref grammars, protected llama-server
flags, the load-time flag check, ports, per-slot context, the API key file, duplicate
YAML keys, validate_values for any source (pyinfra --data), and the error block."""
import os
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.fixture_vars import PINNED_COMMIT, all_yml_vars, prod_host_vars
from voltafleet.inputs import checks, urls
from voltafleet.planning import flags
from voltafleet.inputs.config import CLI_SOURCE, SCHEMA, ConfigError, cli_sources, validate_values
from voltafleet.ground.errors import Problem, format_error, format_errors
from voltafleet.inputs.groupvars import SOURCES_KEY, build_inventory

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SRC = {k: "group_vars/test.yml" for k in SCHEMA}


def refused(values, sources=SRC, host="h1") -> str:
    with pytest.raises(ConfigError) as e:
        validate_values(host, values, sources)
    return str(e.value)


# --- grammars -------------------------------------------------------------------------

@pytest.mark.parametrize("url", [
    "https://huggingface.co/unsloth/Qwen3.6-27B-GGUF/resolve/main/Qwen3.6-27B-Q4_K_S.gguf",
    "http://127.0.0.1:8808/models/tiny-qwen2-f16.gguf",
    "https://mirror.internal/a/b/Qwen-27B-00001-of-00002.gguf?download=true",
    "http://[::1]:8808/m/x.gguf",
])
def test_plain_http_urls_of_gguf_files_pass(url):
    assert urls.http_url_error(url) is None


@pytest.mark.parametrize("url, why", [
    ("https://h.example/m/`touch /tmp/x`.gguf", "not a plain http(s) URL"),
    ("https://h.example/m/$(touch /tmp/x).gguf", "'$'"),
    ("https://h.example/m/a b.gguf", "' '"),
    ("https://h.example/m/x.gguf;id", "';'"),
    ("https://h.example/m/x.gguf\nid", "'\\n'"),
    ("https://h.example/m/x.gguf?a=1&b=2", "'&'"),
    ("file:///srv/models/x.gguf", "only http:// and https://"),
    ("ftp://h.example/x.gguf", "only http:// and https://"),
    ("https://user:pw@h.example/x.gguf", "credentials"),
    ("https://h.example/m/x.bin", "must end in a .gguf file name"),
    ("https://h.example/m/-x.gguf", "must end in a .gguf file name"),
    ("https://h.example/m/.gguf", "must end in a .gguf file name"),
    ("https://-h.example/x.gguf", "not a host name"),
    ("https://h.example:99999/x.gguf", "port 99999 is out of range"),
])
def test_urls_with_shell_characters_or_other_schemes_are_refused(url, why):
    err = urls.http_url_error(url)
    assert err is not None and why in err


@pytest.mark.parametrize("repo", [
    "https://github.com/ggml-org/llama.cpp.git", "git://127.0.0.1:9418/llama.cpp.git",
    "ssh://git@git.internal:2222/mirrors/llama.cpp.git", "git@github.com:ggml-org/llama.cpp.git",
    "/srv/git/llama.cpp.git",
])
def test_git_urls_pass(repo):
    assert urls.git_url_error(repo) is None


@pytest.mark.parametrize("repo, why", [
    ("--upload-pack=touch /tmp/vf-canary", "leading '-'"),
    ("-oProxyCommand=id", "leading '-'"),
    ("ext::sh -c touch% /tmp/x", "not a git URL"),
    ("file:///srv/git/llama.cpp.git", "not a git URL"),
    ("http://github.com/ggml-org/llama.cpp.git", "not a git URL"),
    ("git@-oProxyCommand=id:x", "not a git URL"),
    ("git@host:-x", "not a git URL"),
    ("https://github.com/a/$(id).git", "'$'"),
    ("/srv/../etc/x", "not a git URL"),
    ("relative/path.git", "not a git URL"),
])
def test_bad_git_urls_are_refused(repo, why):
    err = urls.git_url_error(repo)
    assert err is not None and why in err


@pytest.mark.parametrize("ref", [PINNED_COMMIT, "b8000", "lab-next", "release/v1.2", "v1.2.3+cuda"])
def test_git_refs_pass(ref):
    assert urls.git_ref_error(ref) is None


@pytest.mark.parametrize("ref", ["-x", "--upload-pack=id", "a..b", "HEAD@{1}", "a b", "$(id)", "x/", "x.lock",
                                 ".hidden", "/abs", "a//b"])
def test_bad_git_refs_are_refused(ref):
    assert urls.git_ref_error(ref) is not None


@pytest.mark.parametrize("host, ok", [("0.0.0.0", True), ("127.0.0.1", True), ("::", True), ("::1", True),
                                      ("gpu16-01.fleet.internal", True), ("", False), ("0.0.0.0 --port 1", False),
                                      ("/run/llama.sock", False), ("a,b", False), ("999.1.1.1", False),
                                      ("-h", False)])
def test_server_host_is_an_address_or_a_name(host, ok):
    assert (urls.server_host_error(host) is None) == ok


# --- the schema uses them ---------------------------------------------------------------

@pytest.mark.parametrize("key, value, text", [
    ("model_url", "https://h.example/m/`touch /tmp/vf-canary`.gguf", "model_url: is"),
    ("model_url", "file:///srv/m.gguf", "only http:// and https://"),
    ("model_draft_url", "https://h.example/d.gguf; id", "model_draft_url: is"),
    ("llama_cpp_repo", "--upload-pack=touch /tmp/vf-canary", "a leading '-' makes git read it as an option"),
    ("llama_cpp_ref", "--output=/tmp/x", "a leading '-' makes git read it as an option"),
    ("server_host", "0.0.0.0 --api-key x", "server_host: is"),
    ("voltafleet_root", "/opt/../etc", "voltafleet_root: is"),
    ("model_dir", "/var/lib/$(id)", "model_dir: is"),
    ("llama_cpp_cmake_extra", ["-DX=1 -DY=2"], "llama_cpp_cmake_extra: has the item"),
    ("llama_cpp_cmake_extra", ["--trace"], "llama_cpp_cmake_extra: has the item"),
    ("llama_cpp_targets", ["llama-server;id"], "llama_cpp_targets: has the item"),
    ("preflight_supported_os", ["debian-12 x"], "preflight_supported_os: has the item"),
    ("smoke_report_dir", "-rf", "smoke_report_dir: is"),
])
def test_bad_strings_are_refused_with_file_key_and_fix(key, value, text):
    msg = refused({**prod_host_vars(), key: value})
    assert f"group_vars/test.yml: {key}:" in msg and text in msg and "\n  Fix: " in msg


def test_prod_defaults_pass():
    assert validate_values("h1", prod_host_vars(), SRC)["server_port_base"] == 8080


# --- protected and stale flags ----------------------------------------------------------

@pytest.mark.parametrize("extra, flag, var", [
    ("-ngl 10", "-ngl", "server_gpu_layers"), ("--gpu-layers 10", "--gpu-layers", "server_gpu_layers"),
    ("--n-gpu-layers=10", "--n-gpu-layers", "server_gpu_layers"), ("--port 9000", "--port", "server_port_base"),
    ("-m /etc/shadow", "-m", "model_url"), ("--model /etc/shadow", "--model", "model_url"),
    ("--host 10.0.0.1", "--host", "server_host"), ("--api-key-file /etc/shadow", "--api-key-file", "server_api_key_file"),
    ("-c 65536", "-c", "server_ctx"), ("--ctx-size 65536", "--ctx-size", "server_ctx"),
    ("-np 64", "-np", "server_parallel"), ("--cache-type-v f16", "--cache-type-v", "server_cache_type_v"),
    ("--flash-attn off", "--flash-attn", "server_flash_attn"), ("-hfr a/b", "-hfr", "model_url"),
    ("--model-draft /x.gguf", "--model-draft", "model_draft_url"),
    ("-ub 1024", "-ub", "server_ubatch"), ("--ubatch-size 1024", "--ubatch-size", "server_ubatch"),
])
def test_flags_voltafleet_sets_are_refused_naming_their_variable(extra, flag, var):
    msg = refused({**prod_host_vars(), "server_extra_flags": [extra]})
    assert f"server_extra_flags: {flag}" in msg and f"is set by voltafleet from {var}" in msg
    assert f"Fix: set {var} instead, and remove {flag} from server_extra_flags." in msg


@pytest.mark.parametrize("extra", ["--fit on", "--metrics", "-lv 0", "--verbosity 1", "-dev none"])
def test_fixed_flags_are_refused_with_the_reason(extra):
    msg = refused({**prod_host_vars(), "server_extra_flags": [extra]})
    assert "is set by voltafleet: " in msg and "Fix: remove" in msg


def test_every_flag_voltafleet_renders_is_protected(cfg, help_text):
    args = flags.server_args(cfg, "/m/q.gguf", port=1, api_key_file="/k", draft_path="/m/d.gguf")
    names = flags.managed_names(help_text)
    assert [f for f in flags.flag_names(args) if f not in names] == []
    known, _ = flags.parse_help(help_text)
    assert set(flags.MANAGED) <= known  # the table names real flags of the pinned binary


def test_aliases_come_from_the_help_text():
    names = flags.managed_names("-x,    -ngl, --gpu-layers-new N   layers\n--port PORT   port\n")
    assert names["--gpu-layers-new"] == "-ngl" and names["-x"] == "-ngl" and names["--port"] == "--port"
    assert "-x" not in flags.managed_names("--other N   text\n")


def test_harmless_extra_flags_pass(cfg):
    cfg = cfg.replace(server_extra_flags=["--no-webui", "--seed -1", "--spec-draft-n-min 2",
                                          "--cors-origins https://chat.example.com"])
    assert validate_values("h1", cfg, SRC)["server_extra_flags"] == cfg.server.extra_flags


def test_the_model_name_is_one_variable_the_same_on_every_instance(cfg):
    # issue 32: /v1/models lists server_model_alias, never a path; --alias in extra flags is refused
    args = flags.server_args(cfg.replace(server_model_alias="qwen3.6-27b"), "/m/q.gguf", port=1, api_key_file=None)
    assert args[args.index("--alias") + 1] == "qwen3.6-27b"
    assert "--alias" not in flags.server_args(cfg.replace(server_model_alias=None), "/m/q.gguf", port=1, api_key_file=None)
    assert "is set by voltafleet from server_model_alias" in refused(cfg.replace(server_extra_flags=["--alias x"]))
    assert "server_model_alias" in refused(cfg.replace(server_model_alias="/var/lib/m.gguf"))


def test_stale_flag_is_refused_at_load_time_for_the_pinned_commit(cfg):
    msg = refused(cfg.replace(server_extra_flags=["--draft-max 4"]))
    assert "server_extra_flags: --draft-max: llama-server 0c1e57098bba says: the argument has been removed" in msg
    assert "Fix: use --spec-draft-n-max instead." in msg
    msg = refused(cfg.replace(server_extra_flags=["--no-such-flag"]))
    assert "--no-such-flag is not a flag of llama-server 0c1e57098bba" in msg


def test_other_refs_leave_unknown_flags_to_the_build_time_check(cfg):
    cfg = cfg.replace(llama_cpp_ref="lab-next", server_extra_flags=["--no-such-flag"])
    assert validate_values("h1", cfg, SRC)
    cfg = cfg.replace(server_extra_flags=["-ngl 10"])  # protected flags are refused whatever the ref
    assert "is set by voltafleet from server_gpu_layers" in refused(cfg)


def test_shipped_help_is_the_pinned_commits(help_text):
    assert flags.pinned_help(PINNED_COMMIT) == help_text
    assert flags.pinned_help(PINNED_COMMIT[:12]) == help_text
    assert flags.pinned_help("lab-next") is None and flags.pinned_help("0" * 40) is None


def test_the_shipped_tag_s_help_is_its_pin_gate_s_and_checks_extra_flags_before_any_host():
    """group_vars ships llama_cpp_ref: b11434 (a tag): its --help is the one the pin gate asked the lab's
    b11434 server (bench/records/pin-gate/b11434), so server_extra_flags are checked on the controller."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = (root / "bench/records/pin-gate/b11434/llama-server-help.txt").read_text()
    assert flags.pinned_help("b11434") == text and flags.default_help() == text
    assert flags.pinned_help("b99999") is None and flags.pinned_help("master") is None
    # b11434 added --spec-draft-sampling: known at the tag, unknown at the pin before it
    assert flags.extra_flag_errors(["--spec-draft-sampling"], "b11434") == []
    assert "is not a flag of llama-server 0c1e57098bba" in flags.extra_flag_errors(["--spec-draft-sampling"],
                                                                                     PINNED_COMMIT)[0][0]
    what, fix = flags.extra_flag_errors(["--no-such-flag"], "b11434")[0]
    assert "is not a flag of llama-server b11434 (llama_cpp_ref)" in what and "llama-server --help" in fix


@pytest.mark.parametrize("extra", ["--alias $(touch /tmp/vf-canary)", "--alias `id`", "--alias a;id",
                                   "--alias 'a b'", '--alias "x', "--alias a\\ b", "--alias a|b"])
def test_extra_flags_must_be_plain_words(extra):
    msg = refused({**prod_host_vars(), "server_extra_flags": [extra]})
    assert "server_extra_flags: has the item" in msg and "Fix: " in msg


# --- ports, slots, key file -------------------------------------------------------------

def test_port_range_is_checked_for_the_instance_count():
    (p,) = checks.port_problems(65535, 8, sources=SRC)
    assert p.key == "server_port_base" and p.source == "group_vars/test.yml"
    assert "ports 65535-65542 (8 instances) go past 65535" in p.what and p.fix == "set server_port_base to 65528 or less"
    assert checks.port_problems(65528, 8) == []
    assert checks.port_problems(65535, 1) == []


def test_port_range_misses_the_other_ports_of_the_project():
    (p,) = checks.port_problems(8080, 8, other_ports={"gateway_port": 8084})
    assert "ports 8080-8087 (8 instances) include 8084, which gateway_port uses" in p.what
    assert p.fix.startswith("set server_port_base to 8085 or more")
    assert checks.port_problems(8080, 4, other_ports={"gateway_port": 8084}) == []


def test_privileged_ports_are_refused():
    (p,) = checks.port_problems(80, 1)
    assert "cannot bind below 1024" in p.what


def test_port_range_at_load_time_when_server_instances_is_set(cfg):
    msg = refused(cfg.replace(server_instances=8, server_port_base=65535))
    assert "group_vars/test.yml: server_port_base: is 65535: ports 65535-65542" in msg
    assert "Fix: set server_port_base to 65528 or less." in msg


def test_four_token_slots_are_refused(cfg):
    msg = refused(cfg.replace(server_ctx=256, server_parallel=64))
    assert "server_ctx: is 256 for server_parallel 64 slots: 4 tokens a slot, below the minimum 512" in msg
    assert "Fix: raise server_ctx to 32768 or more." in msg
    msg = refused(cfg.replace(server_ctx=4096, server_parallel=16))
    assert "Fix: raise server_ctx to 8192 or more, or lower server_parallel to 8 or less." in msg
    assert validate_values("h1", {**cfg.flat(), "server_ctx": 4096, "server_parallel": 8}, SRC)


@pytest.fixture
def keyfile(tmp_path):
    path = tmp_path / "api-key"
    path.write_text("sk-test-1\n")
    path.chmod(0o600)
    return path


def test_a_private_key_file_passes(cfg, keyfile):
    assert validate_values("h1", {**cfg.flat(), "server_api_key_file": str(keyfile)}, SRC)


@pytest.mark.parametrize("mode, who", [(0o644, "everyone"), (0o640, "its group"), (0o604, "everyone")])
def test_a_key_file_others_can_read_is_refused_with_chmod(cfg, keyfile, mode, who):
    keyfile.chmod(mode)
    msg = refused(cfg.replace(server_api_key_file=str(keyfile)))
    assert f"server_api_key_file: {keyfile} is open to {who} (mode {mode:03o})" in msg
    assert f"Fix: chmod 600 {keyfile}." in msg


def test_a_missing_or_empty_key_file_is_refused_at_load_time(cfg, keyfile, tmp_path):
    msg = refused(cfg.replace(server_api_key_file=str(tmp_path / "nope")))
    assert f"{tmp_path / 'nope'} does not exist on the controller" in msg
    keyfile.write_text("# a comment\n\n")
    assert "holds no key" in refused(cfg.replace(server_api_key_file=str(keyfile)))
    assert "is not a regular file" in refused(cfg.replace(server_api_key_file=str(tmp_path)))


def as_unprivileged(fn) -> str:
    """fn() in a forked child that dropped root for `nobody` (CI runs as root, and root reads
    any file): what it returned, or the exception it raised, as text."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no exec, the modules are already imported
        os.close(r)
        try:
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            out = str(fn())
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out = f"{type(e).__name__}: {e}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out


def test_an_unreadable_key_file_is_refused(cfg):
    d = tempfile.mkdtemp(prefix="voltafleet-key-")
    os.chmod(d, 0o755)  # the unprivileged child may look into it, not read the key
    key = os.path.join(d, "api-key")
    with open(key, "w") as f:
        f.write("secret\n")
    os.chmod(key, 0o000)
    try:
        assert os.geteuid() != 0 or os.access(key, os.R_OK)  # root reads it: the child must not be root
        assert "cannot be read" in as_unprivileged(lambda: refused(cfg.replace(server_api_key_file=key)))
    finally:
        os.unlink(key)
        os.rmdir(d)


# --- values from any source (pyinfra --data) ------------------------------------------

def test_data_values_are_checked_and_named_as_pyinfra_data(cfg):
    src = cli_sources(SRC, ["server_port_base", "ssh_user"])
    assert src["server_port_base"] == CLI_SOURCE and "ssh_user" not in src
    msg = refused(cfg.replace(server_port_base=70000), src)
    assert "pyinfra --data: server_port_base: is 70000, above the maximum 65535" in msg


def test_string_numbers_and_bools_are_read_as_pyinfra_reads_data(cfg):
    out = validate_values("h1", {**cfg.flat(), "server_port_base": "9000", "smoke_enabled": "false",
                                 "llama_cpp_cuda_archs": "[70]"}, SRC)
    assert out["server_port_base"] == 9000 and out["smoke_enabled"] is False and out["llama_cpp_cuda_archs"] == [70]
    assert "above the maximum 65535" in refused(cfg.replace(server_port_base="70000"))
    assert "is '8k' (str)" in refused(cfg.replace(server_ctx="8k"))


def test_flash_attention_off_with_a_quantized_v_cache_is_refused_from_data(cfg):
    msg = refused(cfg.replace(server_flash_attn="off"), cli_sources(SRC, ["server_flash_attn"]))
    assert "pyinfra --data: server_flash_attn: is off, but server_cache_type_v is q8_0" in msg


def test_a_number_where_text_is_wanted_says_how_to_pass_text(cfg):
    msg = refused(cfg.replace(cuda_toolkit_version=12.9), cli_sources(SRC, ["cuda_toolkit_version"]))
    assert "pyinfra --data reads it as float" in msg
    assert """Fix: pass it as a JSON string: --data 'cuda_toolkit_version="..."'.""" in msg


def test_missing_values_are_refused_not_a_keyerror(cfg):
    values = cfg.flat()
    del values["server_threads"]
    assert "server_threads: must be set" in refused(values)


def test_other_keys_are_ignored_and_only_schema_keys_come_back(cfg):
    out = validate_values("h1", {**cfg.flat(), "ssh_user": "deploy", "voltafleet_groups": ["g"]}, None)
    assert set(out) == set(SCHEMA)


def test_without_sources_the_key_is_still_named(cfg):
    msg = refused(cfg.replace(server_threads=0), None)
    assert "\n  server_threads: is 0, below the minimum 1.\n  Fix: set 1 or more." in msg


# --- loader: sources in host data, duplicate keys -------------------------------------

def write_gv(tmp_path, group_text: str) -> Path:
    gv = tmp_path / "gv"
    gv.mkdir()
    (gv / "all.yml").write_text(yaml.safe_dump({**all_yml_vars(), "model_sha256": "a" * 64}))
    (gv / "g.yml").write_text(group_text)
    return gv


def test_host_data_keeps_the_file_of_each_key(tmp_path):
    gv = write_gv(tmp_path, "server_threads: 4\n")
    data = build_inventory({"g": [("h1", {"server_ctx": 4096, "server_parallel": 4, "ssh_port": 22})]},
                           origin="inventory/test.py", group_vars=gv)["g"][0][1]
    src = data[SOURCES_KEY]
    assert src["server_threads"] == "group_vars/g.yml" and src["server_ctx"] == "inventory/test.py (host h1)"
    assert src["model_url"] == "group_vars/all.yml" and set(src) == set(SCHEMA)
    # what the roles do with it: the same checks, naming the file
    msg = refused({**data, "server_threads": 0}, src)
    assert "group_vars/g.yml: server_threads: is 0" in msg


def test_a_duplicated_yaml_key_is_refused_with_both_lines(tmp_path):
    gv = write_gv(tmp_path, "server_threads: 4\nserver_ctx: 4096\nserver_threads: 8\n")
    with pytest.raises(ConfigError) as e:
        build_inventory({"g": ["h1"]}, origin="inventory/test.py", group_vars=gv)
    assert "gv/g.yml: server_threads: set twice, on line 1 and on line 3" in str(e.value)
    assert "Fix: keep one server_threads: line." in str(e.value)


# --- the error block -------------------------------------------------------------------

def test_error_block_names_host_where_what_and_fix():
    text = format_error("gpu16-01", "is 70000, above the maximum 65535", "set 65535 or less",
                        source="group_vars/v100_16gb.yml", key="server_port_base")
    assert text == ("voltafleet: gpu16-01: refused\n"
                    "  group_vars/v100_16gb.yml: server_port_base: is 70000, above the maximum 65535.\n"
                    "  Fix: set 65535 or less.")
    assert format_error(None, "smoke test failed: 3 tok/s", "see the report", title="smoke test failed") == (
        "voltafleet: smoke test failed\n  smoke test failed: 3 tok/s.\n  Fix: see the report.")


def test_one_block_lists_every_problem():
    text = format_errors("h", [Problem("a", "fix a", "f.yml", "k1"), Problem("b", "fix b?", key="k2")], "preflight refused")
    assert text.splitlines() == ["voltafleet: h: preflight refused", "  f.yml: k1: a.", "  Fix: fix a.",
                                 "  k2: b.", "  Fix: fix b?"]


def test_config_error_keeps_its_problems(cfg):
    with pytest.raises(ConfigError) as e:
        validate_values("h9", {**cfg.flat(), "server_extra_flags": ["-ngl 1", "--port 1"]}, SRC)
    assert [p.key for p in e.value.problems] == ["server_extra_flags"] * 2 and e.value.host == "h9"
    assert str(e.value).startswith("voltafleet: h9: configuration refused")


def test_build_time_check_uses_the_binarys_own_aliases(cfg, help_text):
    # a future llama-server that adds an alias of -ngl: refused with the binary's own --help
    newer = help_text.replace("-ngl,  --gpu-layers, --n-gpu-layers N  ", "-ngl,  --gpu-layers, --ngl-new N       ")
    cfg = cfg.replace(server_extra_flags=["--ngl-new 10", "--draft-max 4"])
    args = flags.server_args(cfg, "/m/q.gguf", port=1, api_key_file=None)
    problems = flags.binary_flag_problems(args, cfg.server.extra_flags, newer, source="group_vars/g.yml")
    text = format_errors("h1", problems, "llama-server flags refused, nothing restarted")
    assert "group_vars/g.yml: server_extra_flags: --ngl-new (an alias of -ngl) is set by voltafleet from " \
           "server_gpu_layers" in text
    assert "--draft-max: the pinned llama-server says: the argument has been removed. use --spec-draft-n-max" in text
    assert "Fix: use --spec-draft-n-max instead." in text
    cfg = cfg.replace(server_extra_flags=["--no-webui"])
    assert flags.binary_flag_problems(flags.server_args(cfg, "/m", 1, None), ["--no-webui"], help_text) == []


def test_an_empty_extra_flag_is_refused():
    """Found by the property test: '' would be an argument the env file cannot carry."""
    from voltafleet.planning.flags import split_extra

    for item in ("''", "", '""'):
        args, errors = split_extra([item])
        assert args == [] and "empty argument" in errors[0][0]


def test_draft_count_belongs_to_its_key(cfg):
    msg = refused(cfg.replace(server_extra_flags=["--spec-draft-n-max 4"]))
    assert "server_spec_draft_max" in msg


def test_a_ubatch_past_llama_cpp_s_batch_is_refused_with_its_range(cfg):
    msg = refused(cfg.replace(server_ubatch=4096))
    assert "group_vars/test.yml: server_ubatch: is 4096" in msg and "2048" in msg
