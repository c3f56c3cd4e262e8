"""The tf.data service's servers nomadtf starts itself (run as
`python -m nomadtf.usercode.dataservice`), for the roles data_dispatcher and data_worker:

- `dispatcher --port P --work-dir D`: a DispatchServer in fault-tolerant mode, its journal
  in D (the run's own folder, <model_dir>/data_service): a dispatcher restarted in place
  reads back its workers and the training's jobs, so a restart loses nothing.
- `worker --port P --address HOST:P`: a WorkerServer that registers with the dispatcher in
  NOMADTF_DATA_SERVICE (grpc://host:port) at HOST:P, the address Nomad gave the task (the
  training tasks read from it there). A worker restarted by Nomad registers again.

Both serve until `nomadtf task` stops them (the training ended). Standard library only at
import: TensorFlow is imported when a server starts.
"""

from __future__ import annotations

import argparse
import os
import sys

ENV_DATA_SERVICE = "NOMADTF_DATA_SERVICE"  # wire.ENV_DATA_SERVICE (nothing of nomadtf is imported here)


def dispatcher_address(url: str) -> str:
    """host:port of grpc://host:port (what WorkerConfig takes)."""
    return url.split("://", 1)[-1]


def dispatcher(port: int, work_dir: str):
    """A started DispatchServer on `port`, journaling into `work_dir`."""
    import tensorflow as tf

    service = tf.data.experimental.service
    return service.DispatchServer(service.DispatcherConfig(port=port, work_dir=work_dir, fault_tolerant_mode=True), start=True)


def worker(port: int, address: str, dispatcher_url: str):
    """A started WorkerServer on `port`, registered with the dispatcher as `address`."""
    import tensorflow as tf

    service = tf.data.experimental.service
    config = service.WorkerConfig(dispatcher_address=dispatcher_address(dispatcher_url), worker_address=address, port=port)
    return service.WorkerServer(config, start=True)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m nomadtf.usercode.dataservice")
    parser.add_argument("mode", choices=("dispatcher", "worker"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--work-dir", default="", help="dispatcher: its journal's folder")
    parser.add_argument("--address", default="", help="worker: host:port the training reaches it at")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    who = f"{os.environ.get('NOMADTF_ROLE', args.mode)}[{os.environ.get('NOMADTF_INDEX', '0')}]"
    if args.mode == "dispatcher":
        if not args.work_dir:
            print("nomadtf: the dispatcher needs --work-dir (its journal)", file=sys.stderr)
            return 2
        server = dispatcher(args.port, args.work_dir)
        print(f"nomadtf: tf.data dispatcher {who} at {server.target}, journal in {args.work_dir}", flush=True)
    else:
        url = os.environ.get(ENV_DATA_SERVICE, "")
        if not url or not args.address:
            print(f"nomadtf: the data worker needs {ENV_DATA_SERVICE} (the dispatcher) and --address", file=sys.stderr)
            return 2
        server = worker(args.port, args.address, url)
        print(f"nomadtf: tf.data worker {who} at {args.address}, registered with {url}", flush=True)
    server.join()  # never returns; nomadtf task stops this process when the training is done
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
