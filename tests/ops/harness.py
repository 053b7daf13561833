"""A pyinfra run of the fake-connector scenarios in the test process: what
`pyinfra --debug -y tests/ops/inventory.py tests/ops/toolchain_deploy.py` does (pyinfra_cli's
_main, step for step), through pyinfra's API, in milliseconds instead of a subprocess.

    rc, cmds, out = deploy([host("v100-noble"), host("h100", smi=H100_SMI)])

The same answer as a CLI run (tests/ops/test_toolchain.py run_many): the exit code the CLI
would give (2: the inventory refused a value; 1: deploy code raised, an operation failed or a
host failed; 0), the commands each host was sent, read from the @fake connector itself
(FakeConnector.executed_commands), and the text the CLI would print: pyinfra's log at
--debug level, the greenlet tracebacks gevent prints for hosts whose operation raised, and
the error that stopped the run.

As in the CLI: pyinfra.is_cli is set (operations are identified and ordered by their call
site in the deploy code, so hosts whose operation lists differ still run each operation
together), and a fake host reboots at once (tests/ops/fakefleet.py no_reboot_wait, which the
CLI runs' tests/ops/inventory.py puts in place too).

What differs from the CLI, on purpose:
+ no gevent monkey-patching of the test process (the CLI patches on import): the @fake
  connector and the roles only switch greenlets on gevent primitives;
+ the controller's run-scoped values (roles.run's run context, once-per-run caches, the
  fleet lock) are reset before and after each run, as a new
  `pyinfra` process would start them empty;
+ the commands are whole (the CLI's debug log, which its tests scraped, shows a command's
  first line).

tests/ops/test_cli.py runs fleets through both and checks that they agree: exit code, every
host's commands, every message about a host.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
import traceback
from pathlib import Path

import click
import gevent

import pyinfra
from pyinfra import logger
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import OperationError, PyinfraError
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state
from pyinfra.operations import server as server_ops

from tests.ops.fakefleet import groups_of, no_reboot_wait

REPO = Path(__file__).resolve().parents[2]
DEPLOY = "tests/ops/toolchain_deploy.py"


def deploy(hosts: list[dict] | None = None, deploy_file: str = DEPLOY,
           groups: dict[str, list[dict]] | None = None) -> tuple[int, dict[str, list[str]], str]:
    """Run deploy_file on these fake hosts (or these groups of them) in process:
    (rc, {"@fake/NAME": commands}, output)."""
    # what the CLI's inventory reads from its environment
    scenario = json.loads(json.dumps({"groups": groups} if groups else {"hosts": hosts}))
    every = [h for hs in groups.values() for h in hs] if groups else hosts
    cmds: dict[str, list[str]] = {f"@fake/{h['name']}": [] for h in every}
    out = io.StringIO()
    with _fresh_run(), _cli_mode(), _log_to(out), contextlib.redirect_stderr(out), contextlib.chdir(REPO):
        rc = _run(scenario, deploy_file, cmds, out)
    return rc, cmds, click.unstyle(out.getvalue())


def _run(scenario: dict, deploy_file: str, cmds: dict, out: io.StringIO) -> int:
    # pyinfra_cli.inventory.make_inventory_from_files on tests/ops/inventory.py: its one group
    # `fleet`, the file's own group `inventory`, no group_data, no --data overrides
    try:
        groups = groups_of(scenario)
    except SystemExit as e:  # load_or_exit printed the refusal block
        return e.code if isinstance(e.code, int) else 1
    except Exception:  # the CLI prints the traceback and exits 1
        out.write(traceback.format_exc())
        return 1
    names = list(dict.fromkeys(name for hs in groups.values() for name, _ in hs))
    inventory = Inventory((names, {}), override_data={}, **{g: (hs, {}) for g, hs in groups.items()},
                          inventory=(names, {}))

    config = Config()
    state = State(check_for_changes=False)  # -y
    state.cwd = str(REPO)
    rc = 0
    with ctx_config.use(config), ctx_state.use(state), ctx_inventory.use(inventory):
        config.lock_current_state()
        state.init(inventory, config)
        try:
            state.set_stage(StateStage.Connect)
            connect_all(state)
            state.set_stage(StateStage.Prepare)
            _load_deploy_file(state, deploy_file)
            state.set_stage(StateStage.Execute)
            run_ops(state)
            state.set_stage(StateStage.Disconnect)
        except PyinfraError as e:  # the CLI's WrappedError
            kind = "Operation error" if isinstance(e, OperationError) else "pyinfra error"
            out.write(f"--> {kind}: {e}\n")
            rc = 1
        except Exception:  # UnexpectedExternalError / UnexpectedInternalError: a traceback
            out.write(traceback.format_exc())
            rc = 1
        finally:
            disconnect_all(state)
            for h in inventory:
                cmds.setdefault(h.name, []).extend(h.connector.executed_commands)
        if state.failed_hosts:
            rc = 1
    return rc


def _load_deploy_file(state: State, filename: str) -> None:
    """pyinfra_cli.util.load_deploy_file: the file's code runs once per active host, each in
    its greenlet with its host in context; the first host whose code raised stops the run."""
    path = str(REPO / filename)
    code = compile(Path(path).read_text(encoding="utf-8"), path, "exec")
    state.current_deploy_filename = path
    state.config.lock_current_state()

    def load(h):
        old = state.current_exec_filename
        state.current_exec_filename = path
        try:
            with ctx_config.use(state.config.copy()), ctx_host.use(h):
                exec(code, {"__file__": path})
        except Exception as e:
            return e
        finally:
            state.current_exec_filename = old
        return None

    greenlets = [state.pool.spawn(load, h) for h in state.inventory.get_active_hosts()]
    for g in gevent.iwait(greenlets):
        error = g.get()
        if error is not None:
            raise error
    state.config.reset_locked_state()


@contextlib.contextmanager
def _cli_mode():
    """pyinfra.is_cli (operations are ordered by their call site, as in a deploy file run by
    the CLI, not by their count per host) and a fake host that reboots at once."""
    saved = pyinfra.is_cli, server_ops.sleep
    pyinfra.is_cli = True
    server_ops.sleep = no_reboot_wait
    try:
        yield
    finally:
        pyinfra.is_cli, server_ops.sleep = saved


class _CliFormat(logging.Formatter):
    """pyinfra_cli.log.LogFormatter's text, without its colours: a debug line starts with
    the pyinfra module that logged it ("[pyinfra.connectors.fake] [fake] simulating ...")."""

    def format(self, record):
        message = record.getMessage()
        if record.levelno == logging.DEBUG:
            start = record.pathname.rfind("pyinfra")
            if start:
                message = f"[{record.pathname[start:-3].replace('/', '.')}] {message}"
        return message if "-->" in message else f"    {message}"


@contextlib.contextmanager
def _log_to(out: io.StringIO):
    """pyinfra's log at --debug level into `out`, one message a line (the CLI's LogHandler)."""
    handler = logging.StreamHandler(out)
    handler.setFormatter(_CliFormat())
    saved = logger.level, logger.propagate
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


@contextlib.contextmanager
def _fresh_run():
    """The controller's run-scoped values, empty as in a new process, before and after."""
    _reset()
    try:
        yield
    finally:
        _reset()


def _reset() -> None:
    import roles.run as run
    from voltafleet.state.once import Once

    for lock in run._LOCK:
        lock.release()
    run._LOCK.clear()
    run.run_context.cache_clear()
    run.fleet_plan.cache_clear()
    # pyinfra memoizes a host's temporary directory (its TmpDir fact) by the host's name, for
    # the process: a new run of a host name read it again only in a new process
    from pyinfra.api.host import Host

    Host._get_temp_directory.cache.clear()
    for name, module in list(sys.modules.items()):
        if module is not None and (name == "roles" or name.startswith(("roles.", "voltafleet."))):
            for value in list(vars(module).values()):
                if isinstance(value, Once):
                    value.forget()
