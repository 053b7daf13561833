from voltafleet.planning.restarts import restart_set

UP = {"active": "active", "enabled": "enabled"}


def test_nothing_changed_nothing_restarts():
    assert restart_set([0, 1], set(), False, {0: UP, 1: UP}) == ([], [])


def test_only_changed_env_restarts():
    assert restart_set([0, 1], {1}, False, {0: UP, 1: UP}) == ([1], [])


def test_unit_release_or_model_change_restarts_every_instance():
    assert restart_set([0, 1], set(), True, {0: UP, 1: UP}) == ([0, 1], [])


def test_a_stopped_or_disabled_instance_is_started():
    live = {0: {"active": "failed", "enabled": "enabled"}, 1: {"active": "active", "enabled": "disabled"}}
    assert restart_set([0, 1], set(), False, live) == ([0, 1], [])
    assert restart_set([0, 1], set(), False, {}) == ([0, 1], [])  # a fresh host


def test_instances_no_longer_planned_are_retired_not_restarted():
    assert restart_set([0], {0}, True, {0: UP, 1: UP}) == ([0], [1])
