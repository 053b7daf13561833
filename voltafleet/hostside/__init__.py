"""The programs shipped to the server hosts and run there, standard library only, each one file: the smoke test's measuring client (voltafleet-smoke) and the tune's workload client (voltafleet-workload). Nothing of ours imports them; the controller reads what they print.

Modules: smoke_client, workload.
"""
