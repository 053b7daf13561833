"""The ground floor: what every room uses and that imports nothing of ours: the refusal format (one way to name what is wrong, where it was set and the fix).

Modules: errors.
"""
