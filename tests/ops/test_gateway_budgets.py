"""The gateway role with token budgets (issue 39 item 3) on the fake connector: the budgets' map
is written beside the other team maps (0640, HAProxy's group) and brought to the running
gateway the same way; the folder where HAProxy's worker keeps the counts is its own (user
haproxy, 0750) and in place before the reload that starts the new configuration."""
from tests.ops.harness import deploy
from voltafleet.front import budgets, teams

TEAMS = [{"name": "web", "key_sha256": "a" * 64, "tokens_per_day": 1000}, {"name": "ops", "key_sha256": "b" * 64}]


def run(team_list, responses=()):
    gw = {"name": "gw-1", "responses": list(responses), "vars": {"gateway_teams": team_list}}
    rc, cmds, out = deploy(groups={"gateway": [gw]},
                           deploy_file="tests/ops/gateway_deploy.py")
    assert rc == 0, out[-3000:]
    return cmds["@fake/gw-1"], out


def test_the_budgets_map_and_the_workers_folder_come_before_the_reload():
    cmds, out = run(TEAMS)
    folder = [f"mkdir -p {budgets.DIR}", f"chmod 750 {budgets.DIR}", f"chown haproxy:haproxy {budgets.DIR}"]
    at = cmds.index(folder[0])
    assert cmds[at:at + 3] == folder
    reload = cmds.index("systemctl reload-or-restart haproxy")
    assert at < reload
    bmap = [f"chown root:haproxy {teams.BUDGETS_MAP}", f"chmod 640 {teams.BUDGETS_MAP}"]
    i = cmds.index(bmap[0])
    assert cmds[i:i + 2] == bmap and i < cmds.index(f"chown root:haproxy {teams.KEYS_MAP}") < reload
    assert f"simulating put_file on @fake/gw-1: {teams.BUDGETS_MAP}" in out
    assert teams.show_running(teams.BUDGETS_MAP) in cmds  # its running copy is compared, like the other maps


def test_without_teams_the_budgets_map_goes_and_the_counts_stay():
    present = [[f"stat -c .* {teams.BUDGETS_MAP}",
                f"user=root group=haproxy mode=-rw-r----- atime=0 mtime=0 ctime=0 size=12 '{teams.BUDGETS_MAP}'"]]
    cmds, _ = run([], present)
    assert f"rm -f {teams.BUDGETS_MAP}" in cmds
    assert not any(budgets.DIR in c and c.startswith(("rm", "mkdir")) for c in cmds)
