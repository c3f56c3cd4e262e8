"""DC/OS-compatible entry point: nomadtf calls main(server, log_dir, context).

`server` is a started tf.distribute.Server for this task, built from the cluster spec;
code written for dcos-tensorflow drives it through a TF1-style session on server.target.
This example only proves that the server is wired into the cluster: it runs one tiny
computation on the first ps task.
"""

import json

import tensorflow as tf


def main(server, log_dir, context):
    server_def = server.server_def
    cluster = tf.train.ClusterSpec(server_def.cluster)
    print(f"cluster_jobs={','.join(sorted(cluster.jobs))}", flush=True)
    print(f"context={json.dumps(context)}", flush=True)

    with tf.Graph().as_default():
        with tf.device("/job:ps/task:0"):
            product = tf.constant([1.0, 2.0, 3.0]) * 2.0
        # Only wait for this task and the ps: a session otherwise blocks until every task
        # of the cluster is up, and this computation needs none of the others.
        config = tf.compat.v1.ConfigProto(
            device_filters=["/job:ps/task:0", f"/job:{server_def.job_name}/task:{server_def.task_index}"]
        )
        with tf.compat.v1.Session(server.target, config=config) as session:
            result = session.run(product)

    print(f"ps_result={result.tolist()}", flush=True)
    print("legacy_ok", flush=True)
