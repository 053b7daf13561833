"""An example V100 fleet: edit the host names, keep the groups (they pick group_vars/<group>.yml).

    pyinfra -y inventory/prod.py deploy.py
"""
from voltafleet.inputs.groupvars import load_or_exit

_connect = {"ssh_user": "deploy", "_sudo": True, "ssh_strict_host_key_checking": "yes"}

_groups = load_or_exit({
    # DGX-1 style hosts: 8 x V100-SXM2-16GB
    "v100_16gb": [(f"gpu16-{n:02d}.fleet.internal", _connect) for n in range(1, 5)],
    # 4 x V100-PCIE-32GB
    "v100_32gb": [(f"gpu32-{n:02d}.fleet.internal", _connect) for n in range(1, 3)],
}, origin="inventory/prod.py")
v100_16gb = _groups["v100_16gb"]
v100_32gb = _groups["v100_32gb"]
