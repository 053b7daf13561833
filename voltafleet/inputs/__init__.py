"""The variables users set: their types, ranges and checks, the gateway's teams and tier names, the group_vars loader, the grammars of values that reach a shell, the model pin, two gateways as one address; and the settings typed, one frozen dataclass per section of
group_vars/all.yml, which every stage after the inputs reads (no one outside this room looks a value up by its key).

Modules: config, settings, groupvars, checks, teamvars, urls, pin_model, pairvars.
"""
