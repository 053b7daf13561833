import numpy as np
import gguf
import pytest

from voltafleet.models.gguf_header import Truncated, parse, read_file


@pytest.fixture
def small_gguf(tmp_path):
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(3)
    w.add_embedding_length(64)
    w.add_context_length(4096)
    w.add_token_list([f"t{i}" for i in range(1000)])
    w.add_tensor("token_embd.weight", np.zeros((1000, 64), dtype=np.float16))
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((128, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_reads_metadata_and_tensor_table(small_gguf):
    h = read_file(str(small_gguf), chunk=64)  # tiny chunks: the reader must grow
    assert h.arch == "qwen2" and h.get("block_count") == 3 and h.get("context_length") == 4096
    assert h.meta["tokenizer.ggml.tokens"] == {"array_len": 1000}  # long arrays kept as a length
    assert [(t.name, t.shape, t.nbytes) for t in h.tensors] == [
        ("token_embd.weight", [64, 1000], 64 * 1000 * 2), ("blk.0.ffn_up.weight", [64, 128], 64 * 128 * 4)]
    assert h.header_bytes < small_gguf.stat().st_size


def test_truncated_and_not_gguf(small_gguf):
    data = small_gguf.read_bytes()
    with pytest.raises(Truncated):
        parse(data[:100])
    with pytest.raises(ValueError, match="not a GGUF"):
        parse(b"NOPE" + data[4:])


def test_a_header_cut_anywhere_is_truncated_never_misread(small_gguf):
    """The vocabulary is stepped over without decoding it (a 248k-token one took most of a
    header's parse): any cut inside it or after it still says Truncated."""
    data = small_gguf.read_bytes()
    end = parse(data).header_bytes
    for n in list(range(0, end, 97)) + [end - 1]:
        with pytest.raises(Truncated):
            parse(data[:n])
    assert parse(data[:end]).meta["tokenizer.ggml.tokens"] == {"array_len": 1000}
