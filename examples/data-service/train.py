"""An input-bound Keras model trained with MultiWorkerMirroredStrategy, its input pipeline
run by the tf.data service (roles data_dispatcher and data_worker).

The pipeline's map is deliberately CPU-heavy pure TensorFlow (`heavy` rounds of a 64x64
matmul and tanh per example): read in-process it is the training's bottleneck; read
through the service, the data workers run it and the trainers only train. nomadtf hands
every worker the dispatcher's address as NOMADTF_DATA_SERVICE; without it (a plain local
run) the same pipeline runs in-process.

Keras 3 cannot `fit` under MultiWorkerMirroredStrategy (keras-team/keras#20585), so a
Keras 3 model is trained with a small custom step, as in examples/digits/train_mwms.py.
Keras 2 (tf_keras) can: see docs/guide/data-service.md.
"""

import json
import os

import keras
import tensorflow as tf

DEFAULTS = {"steps": 200, "batch_size": 32, "heavy": 40, "log_every": 20, "learning_rate": 0.05}

try:  # nomadtf's progress channel is optional: the script must also run on its own.
    from nomadtf.progress import report
except ImportError:

    def report(**_metrics):
        pass


def heavy_example(index, rounds):
    """One (features, label) pair, made expensively: `rounds` matmuls of a 64x64 matrix."""
    seed = tf.stack([tf.cast(index, tf.int32), 7])
    x = tf.random.stateless_normal([64, 64], seed=seed)
    mix = tf.random.stateless_normal([64, 64], seed=tf.constant([1, 2])) / 8.0
    for _ in range(rounds):  # unrolled in the graph: the cost is the data worker's CPU
        x = tf.tanh(x @ mix)
    features = tf.reduce_mean(x, axis=0)
    label = tf.cast(tf.reduce_sum(features) > 0, tf.int64)
    return features, label


def pipeline(params, service=""):
    """The input pipeline: through the tf.data service at `service` (grpc://host:port), else in-process."""
    dataset = (
        tf.data.Dataset.range(1 << 40)
        .map(lambda i: heavy_example(i, params["heavy"]), num_parallel_calls=tf.data.AUTOTUNE)
        .batch(params["batch_size"], drop_remainder=True)
    )
    if service:
        # parallel_epochs: each data worker runs the whole (endless) pipeline; every trainer
        # reads from all of them.
        dataset = dataset.apply(tf.data.experimental.service.distribute(processing_mode="parallel_epochs", service=service))
    options = tf.data.Options()
    # The service already spreads the work: no sharding by the strategy on top.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options).prefetch(2)


def main():
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = (strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id)
    is_chief = task[0] in (None, "chief") or task == ("worker", 0)
    params = {**DEFAULTS, **json.loads(os.environ.get("NOMADTF_CONTEXT") or "{}")}
    service = os.environ.get("NOMADTF_DATA_SERVICE", "")
    print(f"input: {'tf.data service at ' + service if service else 'in-process'}", flush=True)

    with strategy.scope():
        model = keras.Sequential([keras.layers.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])
        optimizer = keras.optimizers.SGD(params["learning_rate"])
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    global_batch = params["batch_size"] * strategy.num_replicas_in_sync
    iterator = iter(strategy.experimental_distribute_dataset(pipeline(params, service)))

    @tf.function
    def train_step(iterator):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)), global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        x, y = next(iterator)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_fn, args=(x, y)), axis=None)

    for step in range(1, params["steps"] + 1):
        loss = train_step(iterator)
        if step % params["log_every"] == 0 or step == params["steps"]:
            print(f"step={step} loss={float(loss):.4f}", flush=True)
            if is_chief:
                report(step=step, loss=float(loss))
    print("done", flush=True)


if __name__ == "__main__":
    main()
