"""Property: every string variable of SCHEMA, given shell metacharacters, leading dashes,
spaces, quotes or newlines, is either refused with one clear block (file, key, Fix:) or,
when accepted, is harmless: nothing a shell would act on, quoting round-trips, and the
rendered llama-server argv / env file keep one argument per value."""
import copy
import shlex
import string

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from tests.fixture_vars import prod_host_vars
from voltafleet.models import modelfiles
from voltafleet.planning import flags
from voltafleet.inputs.config import SCHEMA, ConfigError, validate_values
from voltafleet.inputs.settings import Settings

SRC = {k: "group_vars/prop.yml" for k in SCHEMA}


def _kinds(var):
    return var.kind if isinstance(var.kind, tuple) else (var.kind,)


STRING_KEYS = sorted(k for k, v in SCHEMA.items() if str in _kinds(v))
LIST_OF_STRING_KEYS = sorted(k for k, v in SCHEMA.items() if list in _kinds(v) and v.item in (str, None)
                             and k not in STRING_KEYS)
# Valid-looking stems to splice the nasty parts into, so the checks past the first
# character get exercised too.
STEMS = {
    "mirror_extra_paths": ["/models/next.gguf", "/u/r/resolve/abc123/"],
    "model_url": ["https://huggingface.co/u/r/resolve/main/", "http://127.0.0.1:8808/models/", ".gguf"],
    "model_draft_url": ["https://h.example/d/", ".gguf"],
    "llama_cpp_repo": ["https://github.com/ggml-org/", "git://127.0.0.1:9418/", "git@github.com:", "/srv/git/",
                       "llama.cpp.git"],
    "llama_cpp_ref": ["v1.2", "0c1e57098bba", "release/"],
    "voltafleet_root": ["/opt/voltafleet"], "model_dir": ["/var/lib/voltafleet/models"],
    "server_api_key_file": ["/etc/voltafleet/key"], "server_host": ["0.0.0.0", "gpu01.internal", "::1"],
    "server_extra_flags": ["--alias ", "--no-webui", "--seed ", "-ngl ", "--port "],
    "llama_cpp_cmake_extra": ["-DGGML_CUDA_F16=", "ON"], "llama_cpp_targets": ["llama-server"],
    "preflight_supported_os": ["debian-12"], "cuda_toolkit_version": ["12.9"], "server_user": ["llama"],
    "nvidia_driver_version": ["580.95.05", "latest"],
    "smoke_report_dir": ["reports"], "server_gpu_layers": ["all"], "model_sha256": ["a" * 64],
    "model_draft_sha256": ["b" * 64], "server_address": ["10.0.0.2", "gpu01.internal"],
    "gateway_bind": ["0.0.0.0:8000", "127.0.0.1:"], "gateway_metrics_bind": ["127.0.0.1:8404"],
    "smoke_probe_prompt": ["The capital of France is"], "smoke_textfile_dir": ["/var/lib/prometheus/node-exporter"],
}
NASTY = ["$(touch /tmp/vf-canary)", "`touch /tmp/vf-canary`", "; touch /tmp/vf-canary", "&& id", "| id",
         "--upload-pack=touch /tmp/vf-canary", "-oProxyCommand=id", "-", "--", " ", "\t", "\n", "'", '"', "\\",
         "#", "!", "..", "~", "*", "?", "$HOME", "${IFS}", ">", "<", "%n", "\x00", "é"]
SHELL_ACTIVE = set("`$;&|<>'\"\\!") | set(string.whitespace)


def pieces(key):
    plain = st.text(alphabet=string.ascii_letters + string.digits + "._/-:=@%+", max_size=8)
    return st.one_of(st.sampled_from(NASTY), plain, st.sampled_from(STEMS.get(key, ["x"])))


def nasty_value(key):
    return st.lists(pieces(key), min_size=1, max_size=5).map("".join)


@st.composite
def case(draw):
    key = draw(st.sampled_from(STRING_KEYS + LIST_OF_STRING_KEYS))
    text = draw(nasty_value(key))
    return key, ([text] if key in LIST_OF_STRING_KEYS else text)


FREE_TEXT = {"smoke_probe_prompt"}


_BASE = {**prod_host_vars(), "model_draft_sha256": "b" * 64}  # all.yml parsed once, not once per example


def base():
    return copy.deepcopy(_BASE)


# a cap that keeps it a few seconds on a 2-core CI machine (all.yml is parsed once, not per example)
# derandomized: CI sees the same 1,000 examples every run (a find is kept below as an @example)
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True,
          database=None)
@given(case())
@example(("server_host", "::%n&&id"))        # an IPv6 scope id once loaded (issue 28): refused now
@example(("mirror_listen", "fe80::1%$(id)"))
def test_every_string_is_refused_clearly_or_harmless(kv):
    key, value = kv
    values = {**base(), key: value}
    try:
        out = validate_values("h1", values, SRC)
    except ConfigError as e:
        msg = str(e)
        assert msg.startswith("voltafleet: h1: configuration refused")
        assert "\n  Fix: " in msg and "Traceback" not in msg
        for p in e.problems:  # every problem names the file and a key
            assert p.source == "group_vars/prop.yml" and p.key in SCHEMA and p.fix
        assert any(p.key == key for p in e.problems) or {p.key for p in e.problems} <= {
            "model_sha256", "model_draft_sha256"}, (key, msg)  # a split-GGUF URL asks for more checksums
        return
    accepted = out[key] if isinstance(out[key], list) else [out[key]]
    for v in accepted:
        if not isinstance(v, str):
            continue
        assert shlex.split(shlex.quote(v)) == [v]
        if key == "server_extra_flags":
            continue  # checked word by word below
        if key in FREE_TEXT:
            continue  # free text that never reaches a shell or an argv (uploaded as a file)
        assert not (set(v) & SHELL_ACTIVE), (key, v)
        assert not v.startswith("-") or key == "llama_cpp_cmake_extra", (key, v)
        assert v.isprintable()
    render_one_argument_per_value(Settings.of(out))


def render_one_argument_per_value(cfg):
    """The argv of an instance and its env file: systemd splits $LLAMA_SERVER_ARGS on
    whitespace, so the env file must give back exactly the argv, and every accepted value
    that reaches the argv stays one argument."""
    model = modelfiles.model_files(cfg)[0].dest
    args = flags.server_args(cfg, model, port=cfg.server.port_base, api_key_file="/etc/voltafleet/api-key",
                             draft_path=modelfiles.draft_path(cfg))
    env = flags.env_file(0, args, cuda=True)
    line = next(l for l in env.splitlines() if l.startswith("LLAMA_SERVER_ARGS="))
    assert line.split("=", 1)[1].split() == args
    assert args[args.index("--host") + 1] == cfg.server.host
    assert args[args.index("-m") + 1] == model and shlex.quote(model) == model  # safe even unquoted
    for v in (cfg.preflight.root, cfg.model.dir, cfg.build.ref, cfg.server.user,
              cfg.server.host, cfg.toolchain.cuda_toolkit_version):
        assert shlex.quote(v) == v, v  # these reach fact commands and paths: no quoting needed
    extra = [w for item in cfg.server.extra_flags for w in shlex.split(item)]
    assert args[len(args) - len(extra):] == extra
    for w in extra:
        assert not (set(w) & SHELL_ACTIVE) and w.isprintable(), w


@pytest.mark.parametrize("key", [k for k in STRING_KEYS + LIST_OF_STRING_KEYS if k not in FREE_TEXT])
def test_every_string_variable_refuses_a_command_substitution(key):
    stem = STEMS.get(key, ["x"])[0]
    value = stem + "$(touch /tmp/vf-canary)"
    with pytest.raises(ConfigError) as e:
        validate_values("h1", {**base(), key: [value] if key in LIST_OF_STRING_KEYS else value}, SRC)
    assert f"group_vars/prop.yml: {key}:" in str(e.value) and "\n  Fix: " in str(e.value)


def test_free_text_never_reaches_a_shell(cfg):
    """The probe prompt is uploaded as a file and sent as JSON: the smoke command line
    names only the file."""
    from roles.smoke import PROMPT_PATHS, client_command
    from voltafleet.planning.hostplan import HostFacts, make_plan

    cfg = cfg.replace(voltafleet_backend="cpu", server_instances=1, smoke_probe_prompt="$(touch /tmp/vf-canary)")
    cmd = client_command(make_plan("h", cfg, HostFacts(os="debian-12"), None, "0" * 40))
    assert "vf-canary" not in cmd and PROMPT_PATHS["probe"] in cmd


def test_the_property_covers_every_string_variable():
    assert len(STRING_KEYS) >= 15 and {"model_url", "llama_cpp_repo", "server_extra_flags", "server_host"} <= set(
        STRING_KEYS + LIST_OF_STRING_KEYS)


@pytest.mark.parametrize("key", sorted(set(STRING_KEYS + LIST_OF_STRING_KEYS) - {"server_extra_flags"} - FREE_TEXT))
def test_a_trailing_newline_is_refused(key):
    """`$` in a Python regex also matches before a final newline: grammars must use fullmatch."""
    good = base()[key]
    if isinstance(good, list):
        good = good[0] if good else STEMS[key][0]
    if good is None or key == "server_api_key_file":
        good = {"model_draft_url": "https://h.example/d.gguf", "model_draft_sha256": "b" * 64,
                "server_api_key_file": "/etc/voltafleet/key", "model_sha256": "a" * 64,
                "server_address": "gpu01.internal", "mirror_address": "mirror01.internal", "gateway_address": "10.0.0.11", "gateway_vip": "10.0.0.10", "smoke_textfile_dir": "/var/lib/x",
                "nvidia_driver_version": "580.95.05", "server_spec_ngram": "ngram-mod", "tune_try": "slots"}[key]
    value = good + "\n"
    with pytest.raises(ConfigError) as e:
        validate_values("h1", {**base(), key: [value] if key in LIST_OF_STRING_KEYS else value}, SRC)
    assert f"group_vars/prop.yml: {key}:" in str(e.value)
