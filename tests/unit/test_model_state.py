from voltafleet.models.modelstate import is_verified

SHA = "b" * 64


def test_verified_when_sidecar_matches_size_and_mtime():
    state = {"size": 10, "mtime": 100, "sidecar": [f"{SHA} 10 100"]}
    assert is_verified(state, SHA)
    assert is_verified(state, None)


def test_not_verified_when_file_changed_or_sha_differs():
    assert not is_verified({"size": 11, "mtime": 100, "sidecar": [f"{SHA} 10 100"]}, SHA)
    assert not is_verified({"size": 10, "mtime": 101, "sidecar": [f"{SHA} 10 100"]}, SHA)
    assert not is_verified({"size": 10, "mtime": 100, "sidecar": [f"{SHA} 10 100"]}, "c" * 64)
    assert not is_verified({"size": 10, "mtime": 100}, SHA)
    assert not is_verified(None, SHA)
