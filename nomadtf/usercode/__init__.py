"""What user code and the bare TensorFlow servers run; standard library only at import (a job's
own environment imports them without nomadtf's dependencies: venvs.CHILD_MODULES).

- `tfserver`: the bare TensorFlow servers nomadtf starts itself (ps, legacy workers);
- `dataservice`: the tf.data service's DispatchServer and WorkerServer (roles data_dispatcher and data_worker);
- `gpulimit`: the launcher that caps TensorFlow's GPU memory (`gpus.memory_limit_mib`);
- `warmstart`: the bootstrap of a child started ahead of the cluster (imports TensorFlow, waits
  for its handoff, runs the code as `python -u` would);
- `health`: a task's health endpoint (it answers before the runtime loads).

`nomadtf.progress`, which the code itself imports, stays at the top of the package: its name
is part of the code's interface.
"""
