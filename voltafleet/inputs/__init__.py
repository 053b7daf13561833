"""The variables users set: their types, ranges and checks, the group_vars loader, the grammars of values that reach a shell, the model pin.

Modules: config, groupvars, checks, urls, pin_model.
"""
