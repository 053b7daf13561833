import pytest

from voltafleet.models.modelfiles import ModelFile as F, model_files

A, B, C = "a" * 64, "b" * 64, "c" * 64


def test_single_file(cfg):
    assert model_files(cfg) == [F(cfg.model.url, "/var/lib/voltafleet/models/aaaaaaaaaaaaaaaa/Qwen3.6-27B-Q4_K_S.gguf", A)]


def test_split_gguf_fetches_every_part_with_its_checksum(cfg):
    cfg = cfg.replace(model_url="https://m/x/Q-00001-of-00002.gguf", model_sha256=[A, B])
    assert model_files(cfg) == [F("https://m/x/Q-00001-of-00002.gguf", "/var/lib/voltafleet/models/aaaaaaaaaaaaaaaa/Q-00001-of-00002.gguf", A),
                                F("https://m/x/Q-00002-of-00002.gguf", "/var/lib/voltafleet/models/aaaaaaaaaaaaaaaa/Q-00002-of-00002.gguf", B)]


def test_split_gguf_needs_one_checksum_per_part(cfg):
    cfg = cfg.replace(model_url="https://m/x/Q-00001-of-00003.gguf", model_sha256=[A, B])
    with pytest.raises(ValueError, match="lists 2 checksums for 3 file"):
        model_files(cfg)
    cfg = cfg.replace(model_sha256=A)
    with pytest.raises(ValueError, match="must list one checksum per part"):
        model_files(cfg)


def test_draft_model_is_fetched_too(cfg):
    cfg = cfg.replace(model_draft_url="https://m/qwen-0.5b-q8_0.gguf", model_draft_sha256=C)
    assert model_files(cfg)[-1] == F("https://m/qwen-0.5b-q8_0.gguf", "/var/lib/voltafleet/models/cccccccccccccccc/qwen-0.5b-q8_0.gguf", C)


def test_a_new_checksum_under_the_same_name_is_a_new_file(cfg):
    """Files are kept by content: the last good model stays beside the new one for a rollback."""
    old = model_files(cfg)[0].dest
    cfg = cfg.replace(model_sha256=B)
    assert model_files(cfg)[0].dest != old and model_files(cfg)[0].dest.endswith("/Qwen3.6-27B-Q4_K_S.gguf")
    cfg = cfg.replace(model_sha256=None, model_allow_unverified=True)
    assert model_files(cfg)[0].dest == "/var/lib/voltafleet/models/unverified/Qwen3.6-27B-Q4_K_S.gguf"
