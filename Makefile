# voltafleet: `make demo` rolls out on the lab fleet; `make test` runs every test.
# Both work on a fresh Debian 12 machine as root (they install what they need).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
LAB_HOSTS ?= 3
HOST_PACKAGES := debootstrap systemd-container nginx-light git ccache openssh-client curl python3-venv

.PHONY: host-packages setup lab-up lab-down demo test unit bench

host-packages:
	@missing=$$(for p in $(HOST_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

$(VENV)/.installed: requirements.txt | host-packages
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	touch $@

setup: host-packages $(VENV)/.installed

lab-up: setup
	$(PY) -m lab up --hosts $(LAB_HOSTS) --gateway

lab-down: setup
	$(PY) -m lab down

# The main job: bring the lab fleet up (3 servers + HAProxy gateway), then a rolling
# rollout: preflight on every host, the canary, then the rest; the smoke tables and the fleet report.
demo: lab-up
	VOLTAFLEET_SMOKE=always $(PY) -m rollout inventory/lab.py --canary 1 --batch 2

unit: setup
	$(PY) -m pytest -q tests/unit tests/ops

# Every test: unit, fake-connector, and the lab fleet from fresh hosts (GPU tests skip without a GPU).
test: setup
	$(PY) -m lab up --fresh --hosts 3 --gateway
	VOLTAFLEET_REQUIRE_LAB=1 $(PY) -m pytest -v -rs --durations=25 tests

bench: lab-up
	$(PY) bench/rollout.py
