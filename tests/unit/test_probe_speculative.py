"""The golden probe on a server that speculates (issue 41): the pinned llama-server reports no
log-probability for a token out of a speculative step (logprob 0.0, an empty top list; seen on
the lab's CPU build with --spec-type draft-mtp), so those steps are judged by their tokens."""
import pytest

from voltafleet.models import probe
from tests.fixture_vars import all_yml_settings

GOLD = {"tokens": [7, 7, 7, 7], "logprobs": [-9.73, -1.41, -2.52, -1.61]}


def seen(tokens=(7, 7, 7, 7), first=-9.73, drafted=True) -> dict:
    """A probe as the smoke client reads it: the first step sampled, the rest drafted (or not)."""
    rest = [(0.0, []) if drafted else (lp, [(7, lp)]) for lp in GOLD["logprobs"][1:]]
    steps = [(first, [(7, first)])] + rest
    return {"tokens": list(tokens), "logprobs": [lp for lp, _ in steps], "top": [top for _, top in steps]}


def test_a_speculating_server_matches_by_its_tokens_and_its_first_log_probability():
    assert probe.compare(GOLD, seen(), 0.05, speculative=True) is None
    assert "token 2 is 9" in probe.compare(GOLD, seen(tokens=(7, 7, 9, 7)), 0.05, speculative=True)
    assert "differs by" in probe.compare(GOLD, seen(first=-8.0), 0.05, speculative=True)
    first_missing = seen()
    first_missing["top"][0] = []
    assert "token 0 missing" in probe.compare(GOLD, first_missing, 0.05, speculative=True)


def test_a_server_that_does_not_speculate_is_held_to_every_log_probability():
    assert "differs by" in probe.compare(GOLD, seen(), 0.05)  # the drafted zeros are not waved through
    assert probe.compare(GOLD, seen(drafted=False), 0.05) is None
    assert probe.compare(GOLD, seen(drafted=False), 0.05, speculative=True) is None


def test_speculates_reads_every_kind_of_drafting():
    assert not probe.speculates(all_yml_settings(server_spec_mtp=False, server_spec_ngram=None, model_draft_url=None))
    assert all(probe.speculates(all_yml_settings(**c)) for c in ({"server_spec_mtp": True}, {"server_spec_ngram": "ngram-mod"},
                                                                 {"model_draft_url": "http://m/d.gguf"}))


def test_a_golden_probe_is_never_recorded_from_a_speculating_server(tmp_path):
    with pytest.raises(probe.ProbeError, match="does not speculate"):
        probe.save("ab" * 32, "p", 4, seen(), "vf-lab-3", tmp_path)
    assert probe.save("ab" * 32, "p", 4, seen(drafted=False), "vf-lab-1", tmp_path).exists()
