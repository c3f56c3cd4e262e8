"""What a user's command does against a cluster. Nothing here prints.

- `placement`: never, not now, or fits, from Nomad's plan (run, plan, validate);
- `queued`: a submitter's side of admission: whether a controller leads, waiting for a
  suspended run to be admitted, what a queued run says;
- `sharing`: the operator's side of the sharing policy (store, read back, clear);
- `archive`: a run's archive read back, for `status` and `logs` once Nomad has collected the job.

run, follow and the status read-back move here next (docs/design/layout.md).
"""
