"""Run the user's code with TensorFlow's memory capped on every visible GPU.

Used only when a role sets `gpus.memory_limit_mib` (the supervisor then starts the child as
`python -u -m nomadtf.usercode.gpulimit script.py args...` or `... -m module args...`): each GPU
TensorFlow sees becomes one logical device of that size, which must happen before the code
touches a GPU. Without the option nothing of this runs (memory growth is the default,
through TF_FORCE_GPU_ALLOW_GROWTH).
"""

from __future__ import annotations

import os
import runpy
import sys

from nomadtf import wire


def cap_gpu_memory(limit_mib: int) -> list[str]:
    import tensorflow as tf

    capped = []
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit_mib)])
        capped.append(gpu.name)
    return capped


def main(argv: list[str]) -> None:
    limit = int(os.environ[wire.ENV_GPU_MEMORY_LIMIT_MIB])
    capped = cap_gpu_memory(limit)
    print(f"nomadtf: TensorFlow memory capped at {limit} MiB on {', '.join(capped) or 'no GPU'}", file=sys.stderr, flush=True)
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
