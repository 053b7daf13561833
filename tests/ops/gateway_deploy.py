"""The gateway role alone: what tests/ops/test_gateway_budgets.py exercises on the fake connector."""
from roles import speed

speed.applied()  # as deploy.py does
from roles.gateway import gateway  # noqa: E402

gateway()
