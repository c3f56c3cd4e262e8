"""Digits MLP trained with MultiWorkerMirroredStrategy; every worker runs this script.

Each worker holds a full copy of the variables and trains on its shard of every global
batch; gradients are all-reduced between workers, so all copies stay identical. Worker 0
is the chief: it owns NOMADTF_MODEL_DIR and reports the held-out accuracy.

Keras 3 cannot `fit` under MultiWorkerMirroredStrategy, hence the custom loop.
"""

import json
import os
import tempfile

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

DEFAULTS = {
    "steps": 600,
    "batch_size": 64,  # global: split evenly over the workers
    "learning_rate": 0.1,
    "momentum": 0.9,
    "log_every": 50,
    "checkpoint_every": 50,
}

try:  # nomadtf's progress channel is optional: the script must also run on its own.
    from nomadtf import progress
    from nomadtf.progress import report
except ImportError:
    progress = None

    def report(**_metrics):
        pass


def load_data():
    """Digits (8x8 images, 10 classes) scaled to [0, 1], with a fixed 1437/360 split."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    return train_test_split(x, y, test_size=360, random_state=0, stratify=y)


class MLP(tf.Module):
    """64 -> 64 relu -> 10 logits, as plain tf.Variables so the strategy mirrors them."""

    def __init__(self):
        super().__init__()
        init = tf.keras.initializers.GlorotUniform(seed=0)
        self.w1 = tf.Variable(init((64, 64)), name="w1")
        self.b1 = tf.Variable(tf.zeros(64), name="b1")
        self.w2 = tf.Variable(init((64, 10)), name="w2")
        self.b2 = tf.Variable(tf.zeros(10), name="b2")

    def __call__(self, x):
        hidden = tf.nn.relu(x @ self.w1 + self.b1)
        return hidden @ self.w2 + self.b2


def main():
    # Must come before any other TensorFlow op: it configures the collective runtime.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = (strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id)
    # No TF_CONFIG (a plain local run) also counts as chief.
    is_chief = task[0] in (None, "chief") or task == ("worker", 0)

    params = {**DEFAULTS, **json.loads(os.environ.get("NOMADTF_CONTEXT") or "{}")}
    model_dir = os.environ["NOMADTF_MODEL_DIR"]
    x_train, x_test, y_train, y_test = load_data()
    global_batch = params["batch_size"]

    with strategy.scope():
        model = MLP()
        optimizer = tf.keras.optimizers.SGD(params["learning_rate"], momentum=params["momentum"])
        optimizer.build(model.trainable_variables)
        step = tf.Variable(0, dtype=tf.int64, name="global_step")

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    # Saving is a collective: every worker must call save(). Only the chief's copy is kept;
    # the others write to a throwaway directory so they never race on the chief's files.
    scratch = None if is_chief else tempfile.TemporaryDirectory(prefix="nomadtf-mwms-")
    manager = tf.train.CheckpointManager(checkpoint, scratch.name if scratch else model_dir, max_to_keep=3)
    # Every worker restores the chief's latest checkpoint so that all copies start equal;
    # this relies on NOMADTF_MODEL_DIR being readable by every worker (one machine or shared).
    latest = tf.train.latest_checkpoint(model_dir)
    if latest:
        checkpoint.restore(latest).assert_existing_objects_matched()
        print(f"resumed from step {int(step.numpy())}", flush=True)

    def dataset_fn(input_context):
        # Each worker takes a disjoint shard of the examples and its share of the global batch.
        return (
            tf.data.Dataset.from_tensor_slices((x_train, y_train))
            .shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
            .shuffle(len(x_train))
            .repeat()
            .batch(input_context.get_per_replica_batch_size(global_batch), drop_remainder=True)
            .prefetch(2)
        )

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    @tf.function
    def train_step(iterator):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=model(x))
                # Scaled by the global batch: the optimizer sums gradients over replicas.
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        x, y = next(iterator)
        losses = strategy.run(replica_fn, args=(x, y))
        step.assign_add(1)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    while int(step.numpy()) < params["steps"]:
        loss = train_step(iterator)
        done = int(step.numpy())
        if done % params["log_every"] == 0:
            print(f"step={done} loss={float(loss):.4f}", flush=True)
            if is_chief:
                report(step=done, loss=float(loss))
        if done % params["checkpoint_every"] == 0 or done == params["steps"]:
            manager.save(checkpoint_number=done)

    if is_chief and progress is not None:
        # The loop is over: the evaluation and TensorFlow's shutdown (the first worker's
        # waits on its peers) are no hang.
        progress.done()
    if is_chief:
        logits = model(x_test)
        accuracy = float(np.mean(np.argmax(logits.numpy(), axis=1) == y_test))
        print(f"final_accuracy={accuracy:.3f}", flush=True)
    if scratch:
        scratch.cleanup()


if __name__ == "__main__":
    main()
