"""The variables users set: their types, ranges and checks, the gateway's teams and tier names, the group_vars loader, the grammars of values that reach a shell, the model pin, two gateways as one address.

Modules: config, groupvars, checks, teamvars, urls, pin_model, pairvars.
"""
