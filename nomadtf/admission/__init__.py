"""The admission controller: the one authority that starts queued runs on a cluster where
it runs (docs/guide/queueing.md, docs/design/admission.md).

A run is registered by its submitter, with the submitter's own token, *suspended*
(`suspension.py`); the controller (`controller.py`, leader-elected through `lease.py`;
each part of its step a module of its own: `reading.py` the jobs it reads, `walking.py`
the walk and the admitting calls, `admitted.py` the record of who admitted what,
`placing.py` admitted runs until placed whole and formed, `growing.py` elastic growth,
`preempting.py` victims; `bookkeeping.py` its tunables and what it remembers between steps)
orders the suspended runs fairly between namespaces (`order.py`, under the operator's
`policy.py`, with each namespace's remembered `usage.py`, both kept current by
`sharing.py`), checks that the whole run fits (`fit.py`) and admits it by scaling that
exact job version's groups to their wanted counts; it preempts running runs for a run of
much higher priority or a namespace reclaiming its quota (`preemption.py`), and sizes,
grows and shrinks elastic runs (`elastic.py`). It never
registers or edits a job body. What a waiting run is told comes from the board the leader
publishes (`board.py`), with each queued run's estimated start (`forecast.py` reads what
runs, `estimate.py` plans the queue); operators scrape its Prometheus metrics (`metrics.py`) and read
its ledger of each namespace's use (`ledger.py`, `nomadtf usage`).
`deploy.py` is the controller's own Nomad service job.

Nothing is imported here: the pure modules load without any client library.
"""
