"""What user code and the bare TensorFlow servers run; standard library only at import.

- `dataservice`: the tf.data service's DispatchServer and WorkerServer (roles data_dispatcher and data_worker)
"""
