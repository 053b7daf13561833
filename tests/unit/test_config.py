"""group_vars loading and validation: every error names the file, the key and the fix."""
import re
from pathlib import Path

import pytest
import yaml

from voltafleet.inputs.config import SCHEMA, ConfigError
from tests.fixture_vars import all_yml_vars
from voltafleet.inputs.groupvars import GROUP_VARS, build_inventory

SHA = "a" * 64


def write_vars(tmp_path: Path, **groups) -> Path:
    gv = tmp_path / f"group_vars{len(list(tmp_path.glob('group_vars*')))}"
    gv.mkdir()
    (gv / "all.yml").write_text(yaml.safe_dump(all_yml_vars()))
    for name, data in groups.items():
        (gv / f"{name}.yml").write_text(yaml.safe_dump(data))
    return gv


def load(gv, hosts=("h1",), group="g", **kw):
    return build_inventory({group: list(hosts)}, origin="inventory/test.py", group_vars=gv, **kw)


def test_every_schema_key_has_a_commented_default_in_all_yml():
    text = (GROUP_VARS / "all.yml").read_text()
    data = yaml.safe_load(text)
    assert set(data) == set(SCHEMA)
    for key in SCHEMA:
        line = next(l for l in text.splitlines() if l.startswith(key + ":"))
        assert "#" in line and len(line.split("#", 1)[1].strip()) > 10, key


def test_group_files_use_known_keys_only():
    for path in GROUP_VARS.glob("*.yml"):
        assert set(yaml.safe_load(path.read_text())) <= set(SCHEMA), path.name


def test_group_and_host_values_override_all_yml(tmp_path):
    gv = write_vars(tmp_path, g={"server_ctx": 4096, "model_sha256": SHA})
    out = load(gv, hosts=[("h1", {"server_parallel": 2, "ssh_port": 2222})])
    data = out["g"][0][1]
    assert data["server_ctx"] == 4096 and data["server_parallel"] == 2
    assert data["ssh_port"] == 2222 and data["voltafleet_groups"] == ["g"]


def test_unknown_key_names_the_file_and_suggests_the_fix(tmp_path):
    gv = write_vars(tmp_path, g={"server_ctxx": 4096, "model_sha256": SHA})
    with pytest.raises(ConfigError, match=r"group_vars/g\.yml: server_ctxx: unknown key\.\n  Fix: did you mean 'server_ctx'"):
        load(gv)


def test_wrong_type_names_file_key_and_fix(tmp_path):
    gv = write_vars(tmp_path, g={"server_ctx": "big", "model_sha256": SHA})
    with pytest.raises(ConfigError, match=r"group_vars/g\.yml: server_ctx: is 'big' \(str\)\.\n  Fix: give an integer"):
        load(gv)


def test_out_of_range(tmp_path):
    gv = write_vars(tmp_path, g={"server_parallel": 0, "model_sha256": SHA})
    with pytest.raises(ConfigError, match=r"server_parallel: is 0, below the minimum 1\.\n  Fix: set 1 or more"):
        load(gv)


def test_bare_yaml_on_is_explained(tmp_path):
    gv = write_vars(tmp_path, g={"model_sha256": SHA})
    (gv / "g.yml").write_text((gv / "g.yml").read_text() + "server_flash_attn: on\n")
    with pytest.raises(ConfigError, match=r'(?s)server_flash_attn: is True: YAML reads a bare on/off.*Fix: quote it'):
        load(gv)


def test_missing_checksum_is_an_error_unless_explicitly_allowed(tmp_path):
    gv = write_vars(tmp_path)
    with pytest.raises(ConfigError, match=r"(?s)group_vars/all\.yml: model_sha256: no checksum.*Fix: set model_sha256"):
        load(gv)
    gv2 = write_vars(tmp_path, g={"model_allow_unverified": True})
    assert load(gv2)["g"][0][1]["model_sha256"] is None


def test_quantized_v_cache_needs_flash_attention(tmp_path):
    gv = write_vars(tmp_path, g={"model_sha256": SHA, "server_flash_attn": "off"})
    with pytest.raises(ConfigError, match=r"server_flash_attn: is off, but server_cache_type_v is q8_0"):
        load(gv)


def test_partial_offload_on_cuda_needs_explicit_allow(tmp_path):
    gv = write_vars(tmp_path, g={"model_sha256": SHA, "server_gpu_layers": 20})
    with pytest.raises(ConfigError, match=r"(?s)server_gpu_layers: is 20.*server_allow_partial_offload"):
        load(gv)
    gv2 = write_vars(tmp_path, g={"model_sha256": SHA, "server_gpu_layers": 20,
                                  "server_allow_partial_offload": True})
    assert load(gv2)["g"][0][1]["server_gpu_layers"] == 20


def test_api_key_on_the_command_line_is_refused(tmp_path):
    gv = write_vars(tmp_path, g={"model_sha256": SHA, "server_extra_flags": ["--api-key=secret"]})
    with pytest.raises(ConfigError, match=r"server_extra_flags: --api-key passes an API key on the command line"):
        load(gv)


def test_bad_yaml_names_the_file(tmp_path):
    gv = write_vars(tmp_path)
    (gv / "g.yml").write_text("server_ctx: [1,\n")
    with pytest.raises(ConfigError, match=r"group_vars\d*/g\.yml: not valid YAML"):
        load(gv)


def test_extra_vars_file_applies_last_and_is_named_in_errors(tmp_path, monkeypatch):
    gv = write_vars(tmp_path, g={"model_sha256": SHA})
    extra = tmp_path / "canary.yml"
    extra.write_text("llama_cpp_ref: v1.2.3\n")
    monkeypatch.setenv("VOLTAFLEET_VARS", str(extra))
    assert load(gv)["g"][0][1]["llama_cpp_ref"] == "v1.2.3"
    extra.write_text("server_threads: -1\n")
    with pytest.raises(ConfigError, match=re.escape(f"{extra} (VOLTAFLEET_VARS): server_threads: is -1")):
        load(gv)


def test_prod_inventory_refuses_without_a_model_checksum(tmp_path):
    import os
    import subprocess
    import sys
    extra = tmp_path / "no-sha.yml"  # whatever group_vars/all.yml says today
    extra.write_text("model_sha256: null\nmodel_allow_unverified: false\n")
    r = subprocess.run([sys.executable, "-c", "import inventory.prod"], capture_output=True, text=True,
                       cwd=GROUP_VARS.parent, env={**os.environ, "VOLTAFLEET_VARS": str(extra)})
    assert r.returncode == 2
    assert f"{extra} (VOLTAFLEET_VARS): model_sha256: no checksum" in r.stderr
    assert "\n  Fix: set model_sha256" in r.stderr and "Traceback" not in r.stderr
