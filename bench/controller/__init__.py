"""The controller's own costs and estimates.

    scale             a converged no-op `pyinfra -y deploy.py` at N simulated V100 hosts
                      (scale_inventory: pyinfra's fake connector answering as converged hosts):
                      wall time, CPU, peak RSS, operations and commands per host
    scale_inventory   that inventory (loaded by pyinfra from its path)
    plan_check        the plan's timeline (`--plan`) against real rollouts on the lab fleet
    budget_check      what the gateway's token-budget check adds to a request, with and without
                      30 days of day files (issue 48)
"""
