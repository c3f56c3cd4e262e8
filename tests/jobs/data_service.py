"""Training code for tests/stack/test_data_service.py: a small Keras model whose
`model.fit` under MultiWorkerMirroredStrategy reads every batch through the tf.data service
(NOMADTF_DATA_SERVICE; no in-process fallback: without the service it fails).

Keras 2 (tf_keras): Keras 3's `fit` cannot run under MultiWorkerMirroredStrategy
(keras-team/keras#20585: it reduces the first batch's tuple, then the logs, across workers
and fails).

It trains until the file context["until_file"] exists, then `steps_after` more steps, and
writes the number of steps done so far to context["step_file"] (worker 0): the test breaks
the service meanwhile and watches the training go on. The decision to stop is all-reduced,
so both workers stop at the same step (a collective left waiting would hang).

context["step_pause"] (seconds, default 0): a pause after each step. The test waits tens of
seconds for each fault to heal while the training goes on; at full speed the two workers
would take the CPU that the healing (Nomad's restart, the dispatcher's journal, the data
worker's registration) needs on a small machine.
"""

import json
import os
import sys
import time

import tensorflow as tf
import tf_keras as keras

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

with strategy.scope():
    model = keras.Sequential([keras.layers.Input((8,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


@tf.function
def anyone(flag):
    """The sum of every worker's flag (a collective: each worker calls it at each step)."""
    return strategy.reduce("SUM", strategy.run(lambda: flag), axis=None)


class Gate(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.step, self.stop_at = 0, None

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.stop_at is None and float(anyone(tf.constant(float(os.path.exists(params["until_file"]))))) > 0:
            self.stop_at = self.step + params.get("steps_after", 20)
        if chief:
            with open(params["step_file"] + ".tmp", "w") as fh:
                fh.write(str(self.step))
            os.replace(params["step_file"] + ".tmp", params["step_file"])
        if self.step % 50 == 0:
            print(f"step={self.step} loss={logs['loss']:.4f}", flush=True)
        if self.stop_at is not None and self.step >= self.stop_at:
            self.model.stop_training = True
        time.sleep(params.get("step_pause", 0))


gate = Gate()
model.fit(dataset.with_options(options), epochs=1, steps_per_epoch=1 << 30, verbose=0, callbacks=[gate])
print(f"done after {gate.step} steps", flush=True)
sys.exit(0)
