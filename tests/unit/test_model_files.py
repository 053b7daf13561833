import pytest

from voltafleet.hostplan import ModelFile as F, model_files

A, B, C = "a" * 64, "b" * 64, "c" * 64


def test_single_file(cfg):
    assert model_files(cfg) == [F(cfg["model_url"], "/var/lib/voltafleet/models/Qwen3.6-27B-Q4_K_S.gguf", A)]


def test_split_gguf_fetches_every_part_with_its_checksum(cfg):
    cfg.update(model_url="https://m/x/Q-00001-of-00002.gguf", model_sha256=[A, B])
    assert model_files(cfg) == [F("https://m/x/Q-00001-of-00002.gguf", "/var/lib/voltafleet/models/Q-00001-of-00002.gguf", A),
                                F("https://m/x/Q-00002-of-00002.gguf", "/var/lib/voltafleet/models/Q-00002-of-00002.gguf", B)]


def test_split_gguf_needs_one_checksum_per_part(cfg):
    cfg.update(model_url="https://m/x/Q-00001-of-00003.gguf", model_sha256=[A, B])
    with pytest.raises(ValueError, match="lists 2 checksums for 3 file"):
        model_files(cfg)
    cfg["model_sha256"] = A
    with pytest.raises(ValueError, match="must list one checksum per part"):
        model_files(cfg)


def test_draft_model_is_fetched_too(cfg):
    cfg.update(model_draft_url="https://m/qwen-0.5b-q8_0.gguf", model_draft_sha256=C)
    assert model_files(cfg)[-1] == F("https://m/qwen-0.5b-q8_0.gguf", "/var/lib/voltafleet/models/qwen-0.5b-q8_0.gguf", C)
