"""Digits MLP trained with parameter-server strategy (the chief/coordinator side).

nomadtf runs the tf.distribute.Server of every ps and worker task itself; only the chief
runs this script. The chief builds the variables on the ps tasks, schedules training steps
onto the workers through a ClusterCoordinator, checkpoints into NOMADTF_MODEL_DIR and, at
the end, evaluates the trained variables on a held-out split.

Keras 3 cannot `fit` under ParameterServerStrategy, hence the custom loop.
"""

import json
import os

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

DEFAULTS = {
    "steps": 600,
    "batch_size": 64,
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
    """64 -> 64 relu -> 10 logits, as plain tf.Variables so the strategy places them."""

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
    params = {**DEFAULTS, **json.loads(os.environ.get("NOMADTF_CONTEXT") or "{}")}
    model_dir = os.environ["NOMADTF_MODEL_DIR"]
    x_train, x_test, y_train, y_test = load_data()

    # Blocks until every ps and worker task in TF_CONFIG answers.
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver()
    )
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    with strategy.scope():
        model = MLP()
        optimizer = tf.keras.optimizers.SGD(params["learning_rate"], momentum=params["momentum"])
        # Slot variables must exist before the first step: a scheduled function runs on a
        # worker and cannot create variables there.
        optimizer.build(model.trainable_variables)
        step = tf.Variable(0, dtype=tf.int64, name="global_step")

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    manager = tf.train.CheckpointManager(checkpoint, model_dir, max_to_keep=3)
    # Do all checkpoint file IO on the chief: by default each ps task writes its own shard,
    # which lands on the ps task's machine once tasks are spread over several hosts.
    io_options = tf.train.CheckpointOptions(experimental_io_device="/job:chief/replica:0/task:0/device:CPU:0")
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint, options=io_options).assert_existing_objects_matched()
        print(f"resumed from step {int(step.numpy())}", flush=True)

    def dataset_fn():
        # Each worker streams its own shuffled copy; with async updates no sharding is needed.
        return (
            tf.data.Dataset.from_tensor_slices((x_train, y_train))
            .shuffle(len(x_train))
            .repeat()
            .batch(params["batch_size"], drop_remainder=True)
            .prefetch(2)
        )

    per_worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def train_step(iterator):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=model(x))
                )
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        x, y = next(iterator)
        loss = strategy.run(replica_fn, args=(x, y))
        step.assign_add(1)
        return loss

    # Before nomadtf's admission controller preempts the run for another, it asks for a
    # checkpoint: saved at the next step, so that the run loses (almost) nothing.
    if progress is not None:
        progress.on_checkpoint_request()
    # The chief counts scheduled steps itself; `step` on the ps agrees after every join.
    done = int(step.numpy())
    while done < params["steps"]:
        loss = coordinator.schedule(train_step, args=(per_worker_iterator,))
        done += 1
        at_log = done % params["log_every"] == 0
        asked = progress is not None and progress.checkpoint_requested()
        at_checkpoint = done % params["checkpoint_every"] == 0 or done == params["steps"] or asked
        if at_log or at_checkpoint:
            coordinator.join()  # a consistent view of the variables and a fetchable loss
        if at_log:
            loss_value = float(loss.fetch())
            print(f"step={done} loss={loss_value:.4f}", flush=True)
            report(step=done, loss=loss_value)
        if at_checkpoint:
            manager.save(checkpoint_number=done, options=io_options)
            if progress is not None:
                progress.checkpointed(done)

    if progress is not None:
        progress.done()  # the loop is over: the evaluation below is no hang
    logits = model(x_test)
    accuracy = float(np.mean(np.argmax(logits.numpy(), axis=1) == y_test))
    print(f"final_accuracy={accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
