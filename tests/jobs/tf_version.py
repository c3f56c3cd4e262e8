"""Training code for tests/stack/test_environments.py: says which TensorFlow and Python run it,
whether any of nomadtf's own dependencies leaked onto its path, then trains a tiny model
for a few steps with the parameter-server strategy (the chief's side; the ps and worker
run nomadtf's bare TensorFlow server in the same environment).

Context: "steps" (default 5).
"""

import importlib.util
import json
import os
import sys

import numpy as np
import tensorflow as tf

from nomadtf.progress import report  # must work from the job's own environment

context = json.loads(os.environ.get("NOMADTF_CONTEXT") or "{}")
print(f"tf_version={tf.__version__}", flush=True)
print(f"python={sys.executable} prefix={sys.prefix}", flush=True)
leaked = [name for name in ("typer", "consul", "hvac", "nomad", "jinja2", "tenacity") if importlib.util.find_spec(name)]
print(f"leaked={','.join(leaked) or 'none'}", flush=True)

strategy = tf.distribute.experimental.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    w = tf.Variable(tf.zeros((4, 1)), name="w")
    optimizer = tf.keras.optimizers.SGD(0.1)
    optimizer.build([w])

rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype(np.float32)
y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype=np.float32)).astype(np.float32)


def dataset_fn():
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)


iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))


@tf.function
def train_step(it):
    def replica_fn(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(xb @ w - yb))
        optimizer.apply_gradients([(tape.gradient(loss, w), w)])
        return loss

    xb, yb = next(it)
    return strategy.run(replica_fn, args=(xb, yb))


steps = int(context.get("steps", 5))
for _ in range(steps):
    loss = coordinator.schedule(train_step, args=(iterator,))
coordinator.join()
report(step=steps, loss=float(loss.fetch()))
print(f"trained steps={steps} loss={float(loss.fetch()):.4f}", flush=True)
