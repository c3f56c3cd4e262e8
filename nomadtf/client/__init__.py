"""What a user's command does against a cluster. Nothing here prints.

- `run`: `nomadtf run`: load, render once, submit a run (`--replace`, `--resume`; registered
  suspended where an admission controller leads), follow it, stop on failure; `scale`, `stop`;
- `follow`: following a run to its one outcome;
- `runview`: a run's allocations as the client shows them (pure);
- `readback`: reading runs back for `status` and `logs`;
- `status`: what `status` says and `stop` does, as lines (the command line only prints them);
- `cluster_facts`: at submission, the server's version and the cluster profile, with notes for
  what could not be read;
- `acl_setup`: `acl apply` / `acl revoke`: a job's task policies, its tasks' Consul token
  source and its JWT role put in place by an operator;
- `placement`: never, not now, or fits, from Nomad's plan (run, plan, validate);
- `queued`: a submitter's side of admission: whether a controller leads, waiting for a
  suspended run to be admitted, what a queued run says;
- `sharing`: the operator's side of the sharing policy (store, read back, clear);
- `archive`: a run's archive read back, for `status` and `logs` once Nomad has collected the job.
"""
