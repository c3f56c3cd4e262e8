"""Digits MLP trained with Keras 3 on JAX across processes (nomadtf strategy "jax").

Every worker runs this script as one JAX process. nomadtf hands it
KERAS_DISTRIBUTION_JOB_ADDRESSES / _NUM_PROCESSES / _PROCESS_ID (worker i is process i,
worker 0's address the coordinator's) and KERAS_BACKEND=jax, so
`keras.distribution.initialize()` needs no arguments. `DataParallel` puts one copy of the
variables on every device of every process and splits each global batch between them; the
gradients are all-reduced (gloo over TCP on CPU, NCCL on GPUs), so the copies stay identical
and every process prints the same loss.

Each process reads its own shard of the data (auto_shard_dataset=False: Keras shards only a
tf.data.Dataset itself, and this environment holds no TensorFlow). Process 0 saves the
weights and reports the held-out accuracy.
"""

import json
import os
import time

os.environ.setdefault("KERAS_BACKEND", "jax")  # also when run by hand

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

DEFAULTS = {"epochs": 5, "batch_size": 64, "learning_rate": 0.05}

try:  # nomadtf's progress channel is optional: the script must also run on its own.
    from nomadtf.progress import report
except ImportError:

    def report(step, **_metrics):
        pass


class Progress(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        report(epoch + 1, **{k: float(v) for k, v in (logs or {}).items()})


def load_data():
    """Digits (8x8 images, 10 classes) scaled to [0, 1], with a fixed 1437/360 split."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    return train_test_split(x, y, test_size=360, random_state=0, stratify=y)


def main():
    started = time.monotonic()
    if "KERAS_DISTRIBUTION_NUM_PROCESSES" in os.environ:
        keras.distribution.initialize()  # reads KERAS_DISTRIBUTION_*; process 0 hosts the coordinator
    rank, size = jax.process_index(), jax.process_count()
    print(f"process {rank} of {size}; devices {jax.devices()}", flush=True)

    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh(shape=(len(devices),), axis_names=["batch"], devices=devices)
    keras.distribution.set_distribution(keras.distribution.DataParallel(device_mesh=mesh, auto_shard_dataset=False))

    params = {**DEFAULTS, **json.loads(os.environ.get("NOMADTF_CONTEXT") or "{}")}
    x_train, x_test, y_train, y_test = load_data()
    # This process's shard: every size-th example, so the shards have (nearly) equal sizes;
    # the batch each process feeds is its part of the global batch.
    x_train, y_train = x_train[rank::size], y_train[rank::size]
    steps = len(x_train) // (params["batch_size"] // size)
    x_train, y_train = x_train[: steps * (params["batch_size"] // size)], y_train[: steps * (params["batch_size"] // size)]

    keras.utils.set_random_seed(0)  # the same initial weights in every process
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    model.compile(
        optimizer=keras.optimizers.SGD(params["learning_rate"], momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    history = model.fit(x_train, y_train, batch_size=params["batch_size"] // size, epochs=params["epochs"],
                        callbacks=[Progress()], verbose=2)
    loss = history.history["loss"][-1]
    if rank == 0:
        # The held-out set on process 0 alone: no distribution, so no collective to wait for.
        keras.distribution.set_distribution(None)
        logits = np.asarray(model.predict(x_test, verbose=0))
        accuracy = float((logits.argmax(axis=1) == y_test).mean())
        model_dir = os.environ.get("NOMADTF_MODEL_DIR", "/tmp/keras-jax")
        os.makedirs(model_dir, exist_ok=True)
        model.save_weights(os.path.join(model_dir, "digits.weights.h5"))
        report(params["epochs"], loss=loss, test_accuracy=accuracy)
        print(f"final loss {loss:.4f}, held-out accuracy {accuracy:.3f} on {size} processes in {time.monotonic() - started:.1f}s", flush=True)
    else:
        print(f"final loss {loss:.4f} on process {rank}", flush=True)


if __name__ == "__main__":
    main()
