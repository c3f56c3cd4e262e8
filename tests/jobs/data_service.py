"""Training code for tests/stack/test_data_service.py: a small Keras model under
MultiWorkerMirroredStrategy that reads every batch through the tf.data service
(NOMADTF_DATA_SERVICE; no in-process fallback: without the service it fails).

It trains until the file context["until_file"] exists, then `steps_after` more steps, and
writes the number of steps done so far to context["step_file"] (worker 0): the test breaks
the service meanwhile and watches the training go on. The decision to stop is all-reduced,
so both workers stop at the same step (a collective left waiting would hang).
"""

import json
import os
import sys

import keras
import tensorflow as tf

params = json.loads(os.environ["NOMADTF_CONTEXT"])
service = os.environ["NOMADTF_DATA_SERVICE"]
print(f"input: tf.data service at {service}", flush=True)
strategy = tf.distribute.MultiWorkerMirroredStrategy()
chief = strategy.cluster_resolver.task_id == 0

dataset = (
    tf.data.Dataset.range(1 << 40)
    .map(lambda i: (tf.fill([8], tf.cast(i % 7, tf.float32)), i % 2))
    .batch(8, drop_remainder=True)
    .apply(tf.data.experimental.service.distribute(processing_mode="parallel_epochs", service=service))
)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
iterator = iter(strategy.experimental_distribute_dataset(dataset.with_options(options)))

with strategy.scope():
    model = keras.Sequential([keras.layers.Input((8,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.01)
    optimizer.build(model.trainable_variables)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


@tf.function
def train_step(iterator, stop):
    def replica_fn(x, y, stop):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)), global_batch_size=16)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss, stop

    x, y = next(iterator)
    loss, stop = strategy.run(replica_fn, args=(x, y, stop))
    return strategy.reduce("SUM", loss, axis=None), strategy.reduce("SUM", stop, axis=None)


step, stop_at = 0, None
while stop_at is None or step < stop_at:
    loss, stop = train_step(iterator, tf.constant(float(os.path.exists(params["until_file"]))))
    step += 1
    if stop_at is None and float(stop) > 0:
        stop_at = step + params.get("steps_after", 20)
    if chief:
        with open(params["step_file"] + ".tmp", "w") as fh:
            fh.write(str(step))
        os.replace(params["step_file"] + ".tmp", params["step_file"])
    if step % 50 == 0:
        print(f"step={step} loss={float(loss):.4f}", flush=True)
print(f"done after {step} steps", flush=True)
sys.exit(0)
