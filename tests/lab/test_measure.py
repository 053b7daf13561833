"""bench/gpu/v100_measure.py, the command an operator runs on the first V100 host (issue 27), run on
a lab host exactly so: its own release and instance 0's argv on a spare port, the scripts copied
over ssh. The CPU backend has no GPU figures (nvidia-smi is absent): they are null, never invented."""
import json
from pathlib import Path

from bench.gpu.v100_measure import SHIPPED
from tests.lab.helpers import SERVER_HOST, lab, ssh

REPO = Path(__file__).resolve().parents[2]


def test_the_first_host_measurement_runs_on_a_real_host(converged):
    host = lab()["hosts"][0]
    for f in SHIPPED:  # at their repository paths, as the operator's tar line ships them
        ssh(host, f"mkdir -p /tmp/vf-measure/{Path(f).parent} && cat > /tmp/vf-measure/{f}", stdin=(REPO / f).read_text())
    out = json.loads(ssh(host, "cd /tmp/vf-measure && python3 -m bench.gpu.v100_measure --reps 1 --port 18999"))
    assert out["healthy"] and out["args"][out["args"].index("--port") + 1] == "18999"
    assert set(out["prompt_tps"]) == {"128", "512", "1008"}  # 1,024 tokens a lab slot: the longest fits it
    assert all(v > 0 for v in out["prompt_tps"].values()) and out["decode_tps"] > 0
    assert out["cuda_context_mib"] is None and out["pool_growth_mib"] is None and out["slots"] == 4
    # instance 0 kept serving on its own port throughout
    assert "ok" in ssh(host, f"curl -s http://{SERVER_HOST}:$(sed -n 's/.*--port \\([0-9]*\\).*/\\1/p' "
                             "/etc/voltafleet/llama-server/0.env)/health")
