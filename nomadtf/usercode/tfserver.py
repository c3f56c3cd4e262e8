"""The TensorFlow processes nomadtf starts itself (run as `python -m nomadtf.usercode.tfserver`).

- `server`: a bare tf.distribute.Server for parameter servers and workers of the
  parameter-server strategy; no user code is needed there.
- `legacy MODULE:FUNCTION`: the DC/OS beta-tensorflow contract. Parameter servers join;
  every other task calls main(server, log_dir, context); the evaluator, which is not in the
  cluster, gets server=None.

Both read TF_CONFIG, NOMADTF_MODEL_DIR and NOMADTF_CONTEXT from the environment.
"""

from __future__ import annotations

import importlib
import json
import os
import sys


def _server():
    import tensorflow as tf

    tf_config = json.loads(os.environ["TF_CONFIG"])
    task = tf_config["task"]
    cluster = tf.train.ClusterSpec(tf_config["cluster"])
    return tf.distribute.Server(cluster, job_name=task["type"], task_index=task["index"], protocol="grpc", start=True)


def serve() -> int:
    server = _server()
    import tensorflow as tf

    # The version says which Python environment runs the server (job.json `environment`).
    print(f"nomadtf: TensorFlow server {os.environ.get('NOMADTF_ROLE')}[{os.environ.get('NOMADTF_INDEX')}] at {server.target} (TensorFlow {tf.__version__})", flush=True)
    server.join()  # never returns; nomadtf task stops this process when the job is done
    return 0


def legacy(target: str) -> int:
    module_name, _, function_name = target.partition(":")
    # The evaluator is not in the cluster (it reads checkpoints): it has no server to give.
    server = None if os.environ.get("NOMADTF_ROLE") == "evaluator" else _server()
    if os.environ.get("NOMADTF_ROLE") == "ps":
        server.join()
        return 0
    main = getattr(importlib.import_module(module_name), function_name)
    context = json.loads(os.environ.get("NOMADTF_CONTEXT") or "{}")
    main(server, os.environ.get("NOMADTF_MODEL_DIR", ""), context)
    return 0


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "server"
    sys.exit(legacy(sys.argv[2]) if mode == "legacy" else serve())
