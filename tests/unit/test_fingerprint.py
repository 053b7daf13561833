import pytest

from voltafleet.planning.fingerprint import cmake_flags, fingerprint, releases_to_prune

C = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


def test_cuda_flags_for_volta():
    flags = cmake_flags("cuda", [70], [])
    assert "-DGGML_CUDA=ON" in flags
    assert "-DCMAKE_CUDA_ARCHITECTURES=70" in flags
    assert "-DGGML_CUDA_FA_QUANTS=f16-f16;q8_0-q8_0" in flags
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in flags  # offline builds must not fetch the web UI
    assert "-DCMAKE_BUILD_TYPE=Release" in flags


def test_mixed_fleet_archs_are_sorted_and_unique():
    assert "-DCMAKE_CUDA_ARCHITECTURES=70;90" in cmake_flags("cuda", [90, 70, 70], [])


def test_cpu_flags_have_no_cuda():
    assert not [f for f in cmake_flags("cpu", [], []) if "CUDA" in f]


def test_cuda_without_arch_is_an_error():
    with pytest.raises(ValueError):
        cmake_flags("cuda", [], [])


def test_fingerprint_changes_with_each_input_and_not_with_flag_order():
    base = fingerprint(C, ["-DA=1", "-DB=2"], "12.9.86", "12.2.0 x86_64-linux-gnu")
    assert base == fingerprint(C, ["-DB=2", "-DA=1"], "12.9.86", "12.2.0 x86_64-linux-gnu")
    assert len({base,
                fingerprint("1" * 40, ["-DA=1", "-DB=2"], "12.9.86", "12.2.0 x86_64-linux-gnu"),
                fingerprint(C, ["-DA=1", "-DB=3"], "12.9.86", "12.2.0 x86_64-linux-gnu"),
                fingerprint(C, ["-DA=1", "-DB=2"], "12.8.93", "12.2.0 x86_64-linux-gnu"),
                fingerprint(C, ["-DA=1", "-DB=2"], "12.9.86", "13.3.0 x86_64-linux-gnu"),
                fingerprint(C, ["-DA=1", "-DB=2"], "12.9.86", "12.2.0 x86_64-linux-gnu",
                            ["llama-server", "llama-bench"])}) == 6


def test_prune_keeps_newest_and_protected():
    rel = [("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)]
    assert sorted(releases_to_prune(rel, keep=2, protect={"a"})) == ["b", "c"]
    assert releases_to_prune(rel, keep=5, protect=set()) == []
