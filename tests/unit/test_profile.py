"""The tune's workload recorded from the fleet's logs (issue 29): real journal lines of the lab's
llama-server and HAProxy (tests/fixtures/profile, `journalctl -o short-unix` as roles/profile reads
them), parsed into tune_* values."""
import re
from pathlib import Path

import pytest

from roles.profile import command
from voltafleet.measure import profile

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "profile"
SERVER = (FIXTURES / "llama-server.journal").read_text().splitlines()
GATEWAY = (FIXTURES / "haproxy.journal").read_text().splitlines()


def test_every_finished_request_is_read_with_its_prompt_cache_and_answer():
    reqs = profile.requests(SERVER)
    # a request is finished when its eval line follows its new-prompt line in the window
    evals = sum("eval time =" in ln and "prompt eval" not in ln for ln in SERVER)
    assert len(reqs) == evals - 1  # the window's first eval line belongs to a prompt begun before it
    assert all(r.prompt > 0 and r.answer > 0 and 0 <= r.cached <= r.prompt for r in reqs)
    assert reqs[1] == profile.Request(prompt=552, cached=0, answer=16)  # the lab's long probe: 552 tokens
    # a second server process (another pid) with the same task ids is another request
    other = [ln.replace("llama-server[", "llama-server[9") for ln in SERVER]
    assert len(profile.requests(SERVER + other)) == 2 * len(reqs)


def test_the_first_cached_count_is_the_reuse_not_the_checkpoint_step_after_it():
    lines = ["1 h llama-server[3]: I slot operator(): id  1 | task 9 | new prompt, n_ctx_slot = 1024, n_keep = 0, task.n_tokens = 100",
             "1 h llama-server[3]: I slot operator(): id  1 | task 9 | cached n_tokens = 80, memory_seq_rm [80, end)",
             "1 h llama-server[3]: I slot operator(): id  1 | task 9 | cached n_tokens = 96, memory_seq_rm [96, end)",
             "1 h llama-server[3]: I slot print_timing: id  1 | task 9 |        eval time =   9.0 ms /     7 tokens"]
    assert profile.requests(lines) == [profile.Request(100, 80, 7)]


def test_in_flight_counts_only_the_hosts_own_instances_and_answered_requests():
    got = profile.in_flight(GATEWAY, "vf-lab-1")
    mine = [ln for ln in GATEWAY if " llama/vf-lab-1-" in ln]
    assert len(got) == len(mine) and set(got) == {1}  # each alone on its instance while the canary was drained
    others = profile.in_flight(GATEWAY, "vf-lab-2")
    assert others and max(others) >= 2
    busy = GATEWAY[0].replace(" 200 ", " 503 ")
    assert profile.in_flight([busy], GATEWAY[0].split(" llama/")[1].split(" ")[0].rsplit("-", 1)[0]) == []
    assert profile.in_flight(GATEWAY, "vf-lab-1-0") == []  # a host named like an instance is another host


def test_the_workload_is_the_medians_the_follow_up_share_and_the_p90_in_flight():
    reqs = [profile.Request(100 + i, 80 + i if i % 4 == 0 else 0, 30 + i) for i in range(40)]
    values, source = profile.workload(reqs, [1] * 50 + [3] * 40 + [7] * 10, 24)
    assert values == {"tune_prompt_tokens": 120, "tune_answer_tokens": 50, "tune_followup_share": 0.25,
                      "tune_clients": 3}
    assert source["requests"] == 40 and source["in_flight_max"] == 7 and "24 h" in source["source"]
    real, _ = profile.workload(profile.requests(SERVER), profile.in_flight(GATEWAY, "vf-lab-2"), 0.5)
    assert real["tune_answer_tokens"] == 16 and real["tune_clients"] >= 2


def test_too_little_traffic_or_no_gateway_lines_is_a_clear_refusal():
    few = [profile.Request(10, 0, 5)] * (profile.MIN_REQUESTS - 1)
    with pytest.raises(profile.ProfileError, match=r"finished 19 request\(s\) in the last 2 h .*Fix: .*--profile-hours"):
        profile.workload(few, [1], 2)
    with pytest.raises(profile.ProfileError, match="the gateway logged no answered request"):
        profile.workload(few * 2, [], 2)


def test_the_hosts_read_their_own_journal_for_the_window_and_keep_only_what_is_parsed():
    import re
    import shlex

    cmd = command("server", 1.5)
    assert cmd.startswith("bash -o pipefail -c ")  # a journal that cannot be read fails, no match does not
    script = shlex.split(cmd)[-1]
    assert "journalctl -u 'llama-server@*' --since=-5400s -o short-unix" in script and "|| [ $? = 1 ]" in script
    assert "--since=-72s" in command("gateway", 0.02, ["vf-lab-1"])  # seconds: a short window is not rounded to 0
    keep = re.compile(shlex.split(shlex.split(command("server", 1))[-1].split("grep -E ")[1])[0])
    assert all(keep.search(ln) for ln in SERVER)
    gw = shlex.split(shlex.split(command("gateway", 1, ["vf-lab-1", "vf-lab-3"]))[-1].split("grep -E ")[1])[0]
    kept = [ln for ln in GATEWAY if re.search(gw, ln)]  # the gateway keeps the run's hosts' lines only
    assert kept and all(" llama/vf-lab-1-" in ln or " llama/vf-lab-3-" in ln for ln in kept)
    assert len(kept) == sum(" llama/vf-lab-1-" in ln or " llama/vf-lab-3-" in ln for ln in GATEWAY)


def test_a_redispatched_request_is_counted_and_a_follow_up_s_history_is_not_a_prompt_length():
    line = next(ln for ln in GATEWAY if " llama/vf-lab-1-" in ln)
    redispatched = re.sub(r"(---- \d+/\d+/\d+/\d+/)(\d+) ", r"\1+1 ", line, count=1)
    assert redispatched != line and profile.in_flight([redispatched], "vf-lab-1") == profile.in_flight([line], "vf-lab-1")
    # new conversations of 100 tokens; follow-ups carrying 900 tokens of history: the fresh prompt is 100
    reqs = [profile.Request(100, 0, 20)] * 15 + [profile.Request(1000, 900, 20)] * 25
    values, _ = profile.workload(reqs, [2], 1)
    assert values["tune_prompt_tokens"] == 100 and values["tune_followup_share"] == 0.62


def test_follow_up_turns_of_the_lab_tune_s_workload_are_read_from_the_slot_cache_counts():
    """The lab tune's own workload as recorded (tune_prompt_tokens 200, tune_answer_tokens 32, half follow-ups):
    its follow-ups are the requests the server found mostly in a slot's cache."""
    lines = (FIXTURES / "llama-server-followups.journal").read_text().splitlines()
    reqs = profile.requests(lines)
    values, _ = profile.workload(reqs, [2, 2, 3], 1)
    assert values["tune_answer_tokens"] == 32 and 200 <= values["tune_prompt_tokens"] <= 220  # 200 + the template
    follow = [r for r in reqs if r.cached >= r.prompt / 2]
    assert follow and all(r.cached > 200 for r in follow)  # a whole earlier turn reused
    assert 0 < values["tune_followup_share"] == round(len(follow) / len(reqs), 2) < 0.5  # the server reused fewer than asked


def test_the_controller_keeps_only_the_fields_it_reads_of_a_gateway_line():
    kept = [profile.gateway_fields(ln) for ln in GATEWAY]
    assert all(k and "127.0.0.1" not in k and "POST" not in k and "team=" not in k for k in kept)
    assert profile.in_flight(kept, "vf-lab-2") == profile.in_flight(GATEWAY, "vf-lab-2")
    assert profile.gateway_fields("1.0 vf-lab-gw haproxy[5]: Server llama/vf-lab-2-1 is UP") is None
