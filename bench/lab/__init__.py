"""What measures the lab fleet (lab/: `python -m lab up --gateway` first) and the serving path on
this machine; each prints its figures and writes its raw record under reports/.

    load                    a bounded load of completions through the gateway (also the lab tests' client)
    rollout                 lab up, first rollout, no-op re-run and compile times (`make bench`)
    faults                  the fault-injection cases of tests/lab/test_faults.py, summed up
    affinity                conversation affinity against least connections: follow-up TTFT, prompt tokens
    ngram                   n-gram speculation on the lab fleet: tok/s and acceptance
    gateway_usage_latency   what the gateway and its usage filter add to streams (--local: no fleet needed)
    memcg                   the lab's llama-server under its unit's memory ceiling, this machine's kernel (root)
"""
