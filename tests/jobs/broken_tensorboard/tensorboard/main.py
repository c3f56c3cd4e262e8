raise RuntimeError("TensorBoard cannot start: a broken install (tests/jobs/broken_tensorboard)")
