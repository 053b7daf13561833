"""The variables users set: their types, ranges and checks, the group_vars loader, the refusal format, the grammars of values that reach a shell, the model pin.

Modules: config, groupvars, checks, errors, urls, pin_model.
"""
