"""The gateway in front of the servers (HAProxy): backends and runtime commands, teams and their limits, tiers, token budgets, the admin socket, two gateways behind one address.

Modules: gateway, routes, teams, tiers, budgets, haproxy_cli, pair.
"""
