"""The voltafleet lab fleet (see lab/fleet.py)."""
