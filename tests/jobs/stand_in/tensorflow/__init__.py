"""A stand-in for TensorFlow in the bare servers of probe jobs (tests/helpers.probe_job).

Under the parameter-server strategy the worker and ps tasks run no user code: nomadtf starts
a bare `tf.distribute.Server` there (nomadtf.usercode.tfserver). In a probe job, which tests
nomadtf's orchestration with tests/jobs/probe.py as its "training" code, nobody ever talks to
those servers; yet each real one costs an `import tensorflow`: about 8 s of CPU on the CI
machine, twice per probe job. probe_job puts this directory first on the job's PYTHONPATH,
so those servers import this module instead: a server that listens on its task's port, as
TensorFlow's does, and waits. Everything nomadtf does around it (the waiting process's
preimport, the handoff, the port, the process's stop and its exit) is the same.

Jobs that train (examples/, tests/jobs/data_service.py, tf_version.py) never see it: their
workdir is elsewhere, or they set no such path.
"""

import socket
import threading
import time

__version__ = "stand-in"


class train:  # noqa: N801 - the shape of tf.train
    class ClusterSpec:
        def __init__(self, cluster: dict):
            self.cluster = cluster


class distribute:  # noqa: N801 - the shape of tf.distribute
    class Server:
        """Listens where TF_CONFIG puts this task (every interface, like TensorFlow's gRPC
        server), accepts and closes connections, and serves until its process is stopped."""

        def __init__(self, cluster, job_name: str, task_index: int, protocol: str = "grpc", start: bool = True):
            port = int(cluster.cluster[job_name][task_index].rsplit(":", 1)[1])
            self._socket = socket.create_server(("", port), reuse_port=False)
            self.target = f"grpc://localhost:{port}"
            threading.Thread(target=self._accept, daemon=True).start()

        def _accept(self) -> None:
            while True:
                connection, _ = self._socket.accept()
                connection.close()

        def join(self) -> None:
            while True:
                time.sleep(3600)
