"""Rolling rollouts: preflight on every host, then a canary, then batches, each batch a
pyinfra run of deploy.py limited to its hosts; stop when the failed share exceeds the
fail percent. See `python -m rollout --help`."""
