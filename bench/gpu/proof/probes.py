"""What the smoke client's quality probes return through each build (issue 27).

    probe27[:A+B]  voltafleet's long and short probes, greedy, 3 times each, through the Volta-rule and
                   FORCE_MMQ builds (or the builds named: issue 50's mmq+mmqnew, the two pins): the 27B shape
                   and a random-weight qwen35 quantized to Q8_0
"""
from __future__ import annotations

import os

from bench.gpu.proof.runner import ProofRun
from bench.gpu.qwen35_bench import say


def smoke_probes(run: ProofRun, builds: str = "volta+mmq") -> None:
    """`probe27[:A+B]`: the smoke client's probes (voltafleet/hostside/smoke_client.py, as shipped to hosts),
    greedy, 3 times each, on each build named (the Volta-rule and FORCE_MMQ builds unless named): the 27B shape at the v100_16gb argv, and a random-weight
    qwen35 (lab/qwen35gen.py --dense, quantized to Q8_0: MMQ-capable, so the 64+ rule applies);
    a model file that is not there is skipped."""
    from voltafleet.hostside import smoke_client as smoke  # the host-side client, as shipped
    pr = run.plan["probe"]
    out = run.results.setdefault("probe", [])
    tiny = os.path.join(run.a.models, "tiny-q8_0.gguf")
    for model, args in ((run.model_path, pr["args"]), (tiny, pr["tiny_args"])):
        if not os.path.exists(model):
            continue
        for label in builds.split("+"):
            s = run.server(label, "probe-" + os.path.basename(model), args, model=model)
            r = {"build": label, "model": os.path.basename(model), "args": s.args, "healthy": s.ok, "runs": []}
            try:
                for _ in range(3 if s.ok else 0):
                    r["runs"].append({w: smoke.probe(run.port, None, pr[w], pr["tokens"]) for w in ("short", "long")})
            finally:
                s.stop()
            r["log"] = run.loglines(s)
            out.append(r)
            run.save()
            say("probe", label, os.path.basename(model), [(w, x[w].get("prompt_n"), x[w]["tokens"][:4])
                                                          for x in r["runs"][:1] for w in ("short", "long")])
