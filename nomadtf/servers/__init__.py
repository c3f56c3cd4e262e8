"""One module per remote API, the only code that talks to the servers (the local stack's
`devstack/` starts them; the admission controller and the tasks go through these):

- `nomad`: python-nomad: the Nomad HTTP API's endpoints nomadtf calls (`NomadAPI`), each
  with the ACL capability it needs; `nomadhttp`: how Nomad is reached (the nomad CLI's
  settings, TLS), every call sent, and python-nomad's errors mapped to ours once;
- `consul`: py-consul: a run's keys, slots, generation and services (`ConsulDiscovery`);
  `consulhttp`: how Consul is reached, py-consul's errors mapped to ours once, bounded
  retries, and a task's session renewed while it lives;
- `vault`: hvac: the job's secrets, the task's token or AppRole login.

Nothing is imported here: importing one adapter does not load the others' client libraries.
"""
