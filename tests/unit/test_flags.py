from pathlib import Path

import pytest

from voltafleet.planning.flags import check_against_help, env_file, parse_help, server_args


def test_seed_stage3_flags_with_explicit_defaults(cfg):
    args = server_args(cfg, "/m/q.gguf", port=8081, api_key_file=None)
    joined = " ".join(args)
    for part in ("-m /m/q.gguf", "-ngl all", "--fit off", "-c 8192", "-np 4", "-ctk q8_0",
                 "-ctv q8_0", "-fa on", "-t 8", "--host 0.0.0.0", "--port 8081", "--metrics"):
        assert part in joined
    assert "--api-key" not in joined


def test_cpu_backend_offloads_nothing(cfg):
    cfg = cfg.replace(voltafleet_backend="cpu")
    args = server_args(cfg, "/m/q.gguf", port=1, api_key_file=None)
    assert args[args.index("-ngl") + 1] == "0"


def test_api_key_only_as_a_file(cfg):
    args = server_args(cfg, "/m/q.gguf", port=1, api_key_file="/etc/voltafleet/api-key")
    assert args[args.index("--api-key-file") + 1] == "/etc/voltafleet/api-key"


def test_extra_flags_are_split(cfg):
    cfg = cfg.replace(server_extra_flags=["--spec-draft-n-max 4", "--no-webui"])
    args = server_args(cfg, "/m/q.gguf", port=1, api_key_file=None)
    assert args[-3:] == ["--spec-draft-n-max", "4", "--no-webui"]


def test_parse_help_finds_short_long_and_removed_flags(help_text):
    known, removed = parse_help(help_text)
    for name in ("-ngl", "--gpu-layers", "-fit", "--fit", "-ctk", "-np", "--metrics", "--api-key-file",
                 "--spec-draft-n-max", "-md"):
        assert name in known, name
    assert "--draft-max" in removed and "--spec-draft-n-max" in removed["--draft-max"]


def test_rendered_flags_pass_the_pinned_binary(cfg, help_text):
    args = server_args(cfg, "/m/q.gguf", port=1, api_key_file="/k")
    assert check_against_help(args, help_text) == []


def test_stale_seed_flag_names_its_replacement(cfg, help_text):
    cfg = cfg.replace(server_extra_flags=["--draft-max 4"])
    errors = check_against_help(server_args(cfg, "/m", 1, None), help_text)
    assert len(errors) == 1 and errors[0].startswith("--draft-max:") and "--spec-draft-n-max" in errors[0]


def test_unknown_flag_is_refused(cfg, help_text):
    cfg = cfg.replace(server_extra_flags=["--no-such-flag"])
    errors = check_against_help(server_args(cfg, "/m", 1, None), help_text)
    assert errors == ["--no-such-flag: not a flag of the pinned llama-server; see llama-server --help"]


def test_flag_gone_from_help_uses_the_replacement_table():
    errors = check_against_help(["--draft-max", "4"], "-m,    --model FNAME                         model path\n")
    assert "use --spec-draft-n-max instead" in errors[0]


def test_negative_numbers_are_values_not_flags(help_text):
    assert check_against_help(["-np", "4", "--seed", "-1"], help_text) == []


def test_env_file_pins_the_gpu_and_refuses_whitespace(cfg):
    text = env_file(3, ["-m", "/m/q.gguf"], cuda=True)
    assert "CUDA_VISIBLE_DEVICES=3\n" in text and "LLAMA_SERVER_ARGS=-m /m/q.gguf\n" in text
    assert "CUDA_VISIBLE_DEVICES=\n" in env_file(0, ["-m", "x"], cuda=False)
    with pytest.raises(ValueError, match="whitespace"):
        env_file(0, ["-m", "/my models/q.gguf"], cuda=True)


def test_draft_model_flags_are_current(cfg, help_text):
    args = server_args(cfg, "/m/q.gguf", port=1, api_key_file=None, draft_path="/m/d.gguf")
    assert args[args.index("-md") + 1] == "/m/d.gguf" and args[args.index("-ngld") + 1] == "all"
    assert check_against_help(args, help_text) == []


def test_ngram_speculation_is_one_spec_type_list_and_passes_the_pinned_binary(cfg, help_text):
    assert "--spec-type" not in server_args(cfg, "/m.gguf", 8080, None)
    args = server_args(cfg.replace(server_spec_ngram="ngram-mod"), "/m.gguf", 8080, None)
    assert args[args.index("--spec-type") + 1] == "ngram-mod" and "--spec-draft-n-max" not in args
    both = server_args(cfg.replace(server_spec_ngram="ngram-simple", server_spec_mtp=True), "/m.gguf", 8080, None)
    assert both[both.index("--spec-type") + 1] == "draft-mtp,ngram-simple" and both.count("--spec-type") == 1
    assert check_against_help(args, help_text) == []


def test_an_unknown_ngram_type_is_refused_naming_the_choices():
    from voltafleet.inputs.config import ConfigError, check_value

    check_value("server_spec_ngram", "ngram-map-k", "group_vars/v100_32gb.yml")
    check_value("server_spec_ngram", None, "group_vars/v100_32gb.yml")
    with pytest.raises(ConfigError) as e:
        check_value("server_spec_ngram", "ngram-fast", "group_vars/v100_32gb.yml")
    assert "server_spec_ngram" in str(e.value) and "ngram-mod" in str(e.value)


def test_ubatch_is_rendered_only_when_set_and_passes_the_pinned_binary(cfg, help_text):
    assert "-ub" not in server_args(cfg, "/m/q.gguf", port=1, api_key_file=None)  # llama.cpp's 512
    cfg = cfg.replace(server_ubatch=1024)
    args = server_args(cfg, "/m/q.gguf", port=1, api_key_file=None)
    assert args[args.index("-ub") + 1] == "1024" and check_against_help(args, help_text) == []


def test_malloc_heap_puts_glibc_s_tunables_in_the_env_file_and_only_there():
    """server_malloc_heap: the env file (EnvironmentFile= of the unit) carries GLIBC_TUNABLES, never the argv;
    off, no line. The V100 groups ship it on, all.yml off (bench/RESULTS.md issue 51, session 4)."""
    line = "GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
    on, off = env_file(0, ["-np", "16"], cuda=True, malloc_heap=True), env_file(0, ["-np", "16"], cuda=True)
    assert on.splitlines()[1:] == ["CUDA_VISIBLE_DEVICES=0", line, "LLAMA_SERVER_ARGS=-np 16"]
    assert off.splitlines()[1:] == ["CUDA_VISIBLE_DEVICES=0", "LLAMA_SERVER_ARGS=-np 16"]
    from bench.gpu.groups import group_cfg
    assert {g: group_cfg(g).server.malloc_heap for g in ("v100_32gb", "v100_16gb")} == {"v100_32gb": True, "v100_16gb": True}
    import yaml
    assert yaml.safe_load((Path(__file__).parents[2] / "group_vars/all.yml").read_text())["server_malloc_heap"] is False
