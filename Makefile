# voltafleet: `make demo` rolls out on the lab fleet; `make test` runs every test.
# Both work on a fresh Debian 12 machine as root (they install what they need).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
LAB_HOSTS ?= 3
HOST_PACKAGES := debootstrap systemd-container iproute2 nginx-light git ccache openssh-client curl python3-venv haproxy socat faketime gcc libc6-dev

.PHONY: host-packages promtool setup lab-up lab-down demo test unit bench

host-packages:
	@missing=$$(for p in $(HOST_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi; \
	if echo "$$missing" | grep -qx haproxy; then systemctl disable --now haproxy >/dev/null 2>&1 || true; fi

# promtool (Debian's prometheus package) for the alert-rule tests. Its daemon is kept from
# starting while the package installs (policy-rc.d, unless one is there) and disabled after,
# so nothing listens on port 9090.
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  made=; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; \
	    chmod 755 /usr/sbin/policy-rc.d; made=1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; \
	  rc=$$?; if [ -n "$$made" ]; then rm -f /usr/sbin/policy-rc.d; fi; \
	  systemctl disable --now prometheus >/dev/null 2>&1 || true; exit $$rc; }

$(VENV)/.installed: requirements.txt | host-packages
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	touch $@

setup: host-packages promtool $(VENV)/.installed

lab-up: setup
	$(PY) -m lab up --hosts $(LAB_HOSTS) --gateway

lab-down: setup
	$(PY) -m lab down

# The main job: bring the lab fleet up (3 servers + a pair of HAProxy gateways, one address), then a rolling
# rollout: preflight on every host, the canary, then the rest; the smoke tables and the fleet report.
# Then the pin gate for llama.cpp b11434 (issue 50): the fleet to it and back under load, the sm_70 compile's and the
# GPU proof's records read from bench/records: `pass` (exit 0); exit 3 (`incomplete`) if a record is missing.
demo: lab-up
	VOLTAFLEET_SMOKE=always $(PY) -m rollout inventory/lab.py --canary 1 --batch 2
	$(PY) -m rollout inventory/lab.py --pin-check b11434; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 3 ]

unit: setup
	$(PY) -m pytest -q tests/unit tests/ops

# Every test: unit, fake-connector, and the lab fleet from fresh hosts (GPU figures: bench/gpu/gpu_proof.py,
# their raw records checked by tests/unit/test_proof*.py).
# The fast tests first, each suite in its own process (the in-process pyinfra harness of
# tests/ops keeps nothing from the lab tests' session), while beside them the lab's fresh hosts are made
# (copies and boots), the first rollout builds the pinned llama-server, and that llama-server then serves
# usage per team through this machine's HAProxy (tests/gateway_local) and runs in a memory cgroup of this
# machine's kernel with its unit's ceiling (tests/kernel, as root: fails, never skips, without a writable
# memory controller); none of these touch the lab hosts after the first rollout, and their output follows
# the unit tests'. Then the lab fleet's tests, and last the two local suites' exit codes (a failure there
# fails the target without keeping the lab tests from running).
# First of all the linter (ruff, pinned in requirements.txt, configured in ruff.toml): a finding fails
# the target in a second, before any lab host is made.
# The lab session's release cache starts empty (a test that counts compiles must not find what `make demo`
# left); the session's first rollout runs beside the unit tests, and the lab tests take its record
# (tests/lab/first.py; tests/lab/conftest.py first_rollout).
TEST_RELEASES := $(CURDIR)/.voltafleet/test-releases
FIRST_ROLLOUT := $(CURDIR)/.voltafleet/first-rollout.json
LOCAL_RC := $(CURDIR)/.voltafleet/local-tests.rc
# tests/gateway_local's slowest file (a model written, a llama-server of the first rollout's build) runs in the
# unit tests' branch once they end and the first rollout's record is there (the two branches end about
# together); its exit code is judged last with the other local suites' ("none": the lab chain left no record)
TRAFFIC51 := tests/gateway_local/test_traffic51.py
T51_RC := $(CURDIR)/.voltafleet/traffic51.rc

test: setup
	$(PY) -m ruff check .
	@mkdir -p .voltafleet; rm -rf $(TEST_RELEASES) $(FIRST_ROLLOUT) $(LOCAL_RC) $(T51_RC); mkdir -p $(TEST_RELEASES); \
	echo "$(PY) -m lab up --fresh --hosts 3 --gateway, the first rollout, then tests/gateway_local and tests/kernel  (beside the unit tests)"; \
	( $(PY) -m lab up --fresh --hosts 3 --gateway && \
	  VOLTAFLEET_RELEASE_CACHE=$(TEST_RELEASES) $(PY) -m tests.lab.first $(FIRST_ROLLOUT) || exit $$?; \
	  $(PY) -m pytest -v -rs tests/gateway_local --ignore=$(TRAFFIC51); gw=$$?; $(PY) -m pytest -v -rs tests/kernel; k=$$?; \
	  echo "tests/gateway_local exit $$gw, tests/kernel exit $$k"; echo "$$gw $$k" > $(LOCAL_RC) ) \
	  > .voltafleet/lab-up.log 2>&1 & up=$$!; \
	$(PY) -m pytest -q -rs --durations=10 tests/unit tests/ops; unit=$$?; \
	while [ ! -e $(FIRST_ROLLOUT) ] && kill -0 $$up 2>/dev/null; do sleep 1; done; \
	t51=none; if [ -e $(FIRST_ROLLOUT) ]; then $(PY) -m pytest -q -rs $(TRAFFIC51); t51=$$?; fi; echo $$t51 > $(T51_RC); \
	wait $$up; lab=$$?; cat .voltafleet/lab-up.log; \
	if [ $$lab -ne 0 ]; then echo "make test: lab up or the first rollout failed (exit $$lab), see above" >&2; fi; \
	[ $$unit -eq 0 ] && [ $$lab -eq 0 ]
	VOLTAFLEET_REQUIRE_LAB=1 VOLTAFLEET_RELEASE_CACHE=$(TEST_RELEASES) VOLTAFLEET_LAB_FIRST_ROLLOUT=$(FIRST_ROLLOUT) \
	  $(PY) -m pytest -v -rs --durations=50 tests/lab
	@read gw k < $(LOCAL_RC) && read t51 < $(T51_RC) && [ "$$gw" = 0 ] && [ "$$k" = 0 ] && [ "$$t51" = 0 ] || \
	  { echo "make test: tests/gateway_local exit $$gw ($(TRAFFIC51): $$t51), tests/kernel exit $$k (their output follows the unit tests')" >&2; exit 1; }

bench: lab-up
	$(PY) -m bench.lab.rollout
