"""One module per remote API, the only code that talks to the servers (the local stack's
`devstack/` starts them; the admission controller and the tasks go through these):

- `nomad`: python-nomad: the Nomad HTTP API, its errors mapped to ours once;
- `consul`: py-consul: a run's keys, its session, slots, generation and services (`ConsulDiscovery`);
- `vault`: hvac: the job's secrets, the task's token or AppRole login.

Nothing is imported here: importing one adapter does not load the others' client libraries.
"""
