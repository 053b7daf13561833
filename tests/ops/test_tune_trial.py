"""roles/tune's after-load reading (issue 38): on CUDA the trial's instance 0 is restarted and its GPU's
memory read once /health answers, before the workload sends any request."""
from types import SimpleNamespace

from roles.shell import restart_command
from roles.tune import loaded


class Host:
    """A host answering each command from a script: {command substring: (ok, stdout, stderr)}."""

    def __init__(self, answers):
        self.name, self.data, self.answers, self.sent = "gpu-01", {}, answers, []

    def run_shell_command(self, command, **kw):
        self.sent.append(command)
        ok, out, err = next(v for k, v in self.answers.items() if k in command)
        return ok, SimpleNamespace(stdout=out, stderr=err)


PLAN = SimpleNamespace(instances=[SimpleNamespace(index=3)])


def test_instance_0_restarts_then_its_gpu_memory_is_read_before_any_request():
    h = Host({"systemctl": (True, "", ""), "nvidia-smi": (True, "22133\n", "")})
    assert loaded(h, PLAN) == (True, 22133.0, "")
    assert h.sent == [restart_command(3), "nvidia-smi -i 3 --query-gpu=memory.used --format=csv,noheader,nounits"]


def test_a_restart_that_fails_stops_the_trial_with_its_reason():
    h = Host({"systemctl": (False, "", "Job for llama-server@3.service failed.\n"), "nvidia-smi": (True, "1\n", "")})
    ok, mib, why = loaded(h, PLAN)
    assert (ok, mib) == (False, None) and "llama-server@3 did not restart" in why and "Job for" in why
    assert len(h.sent) == 1  # nothing read from a server that is not up


def test_an_unreadable_gpu_leaves_the_figure_out_not_the_trial():
    h = Host({"systemctl": (True, "", ""), "nvidia-smi": (False, "", "NVIDIA-SMI has failed")})
    assert loaded(h, PLAN) == (True, None, "")
