"""Shared fixtures. `stack` is the real local Nomad + Consul + OpenBao: reused when it is
already up, started (and stopped at the end) otherwise. It never skips: a stack that cannot
start fails the run."""

from __future__ import annotations

import os
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from nomadtf.devstack.cluster import ClusterStack
from nomadtf.devstack.stack import DevStack
from tests.helpers import OTHER_TF

# scripts/test runs the tests of the several-client stack (marker `cluster`, given here to
# every test that uses it) in a pytest session of their own beside the rest, so the two
# stacks' scenarios run side by side while each stack keeps the idle cluster its tests
# assume. The unit tests carry the marker `unit` (everything under tests/unit: no stack), so
# `-m unit` selects them. The marks go on as each test is collected, before `-m` selects.
UNIT_TESTS = Path(__file__).parent / "unit"


def pytest_itemcollected(item):
    if "secure_cluster" in item.fixturenames:
        item.add_marker(pytest.mark.cluster)
    if item.path.is_relative_to(UNIT_TESTS):
        item.add_marker(pytest.mark.unit)


def _progress(message: str) -> None:
    sys.stderr.write(f"[stack] {message}\n")


# The test bed's Nomad client offers fake NVIDIA GPUs through the project's device plugin,
# as a GPU node would: enough for the GPU example (a 1-GPU chief, two 2-GPU workers) and
# one to spare.
TEST_GPUS = 6
# Beside them, MIG slices as nomad-device-nvidia 1.1 lists them (`dev up --mig`: GPUs named
# "<model> MIG 1g.5gb" with a slice's memory), where `gpus.model` / `min_memory` must keep a
# role off them (tests/stack/test_gpus.py).
TEST_MIG = 2
# and its own Docker daemon beside raw_exec, as a client of a shared cluster would have
# (`dev up --docker`): the container tests run there.
TEST_DOCKER = True


@pytest.fixture(scope="session")
def stack(request):
    dev = DevStack.default()
    started = dev.up(progress=_progress, timeout=180, gpus=TEST_GPUS, mig=TEST_MIG, docker=TEST_DOCKER)
    saved = {k: os.environ.get(k) for k in ("NOMAD_ADDR", "CONSUL_HTTP_ADDR", "VAULT_ADDR", "VAULT_TOKEN", "DOCKER_HOST")}
    os.environ.update(dev.env())
    wanted = [version for name, version in IMAGE_FIXTURES.items() if any(name in item.fixturenames for item in request.session.items)]
    if wanted:
        _start_image_builds(dev, wanted)
    yield dev
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if started and not os.environ.get("NOMADTF_KEEP_STACK"):
        dev.down(progress=_progress)


@pytest.fixture(scope="session")
def docker_client(stack):
    """The Docker SDK on the session stack's own daemon."""
    return stack.daemon.client(timeout=900)


# The images of the container tests are built (minutes each on a fresh machine: a Debian
# base, a wheelhouse with TensorFlow, `docker build`) in the background, one after the
# other, from the moment the stack is up, when the session has a test that needs them, so
# the builds overlap the tests before the first container test; at the lowest CPU priority
# (images.build's yield_cpu), so that the tests they overlap do not wait for them. `task_image`: this
# checkout for this installation's TensorFlow; `other_tf_image`: the second TensorFlow
# version (tests/stack/test_docker.py trains both side by side).
IMAGE_FIXTURES = {"task_image": None, "other_tf_image": OTHER_TF}
_image_builds: dict[str | None, Future] = {}


def _build_image(client, tf_version: str | None) -> str:
    from nomadtf.devstack import images

    return images.build(client, lambda message: sys.stderr.write(f"[image] {message}\n"), tf_version=tf_version, yield_cpu=True)


def _build_marked(client, tf_version: str | None, ref: str | None) -> str:
    from tests import images

    try:
        return _build_image(client, tf_version)
    finally:
        if ref:
            images.mark_done(ref)


def _start_image_builds(dev: DevStack, versions: list[str | None]) -> None:
    """Each build is marked underway from its submission (they run one after the other) for
    the several-client session, which copies the image from this daemon rather than build it
    again (tests/images.py)."""
    from nomadtf.devstack import images as dev_images
    from nomadtf.errors import DevStackError
    from tests import images

    builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="images")
    client = dev.daemon.client(timeout=900)
    for version in versions:
        try:
            ref = dev_images.reference(version)
            images.mark_underway(ref)
        except DevStackError:
            ref = None  # the build says why, in the test that needs the image
        _image_builds[version] = builder.submit(_build_marked, client, version, ref)
    builder.shutdown(wait=False)


def _image(client, tf_version: str | None) -> str:
    build = _image_builds.get(tf_version)
    return build.result() if build else _build_image(client, tf_version)  # a failed build raises in the test that needs it


@pytest.fixture(scope="session")
def task_image(docker_client) -> str:
    """The task image of this checkout for this installation's TensorFlow, built once per
    session (and found again in the daemon's data root on a machine that built it before)."""
    return _image(docker_client, None)


@pytest.fixture(scope="session")
def other_tf_image(docker_client) -> str:
    """The same image for TensorFlow OTHER_TF."""
    return _image(docker_client, OTHER_TF)


# A test that stops and restarts the stack (marker `restarts_stack`) runs after the others,
# so no test, and no image build in the background, sees its servers go away. The tests that
# need a task image run last of the others: the builds, at the lowest priority on a busy
# machine, have then had the longest time to end (on a fresh machine the second image was
# still building when the container tests came, and the session waited minutes for it). The
# several-client stack's container test copies the single-node session's build
# (tests/images.py), so it too runs last of its session.
def _needs_an_image(item) -> bool:
    if item.get_closest_marker("cluster") is not None:
        return item.get_closest_marker("docker") is not None
    return any(name in item.fixturenames for name in IMAGE_FIXTURES)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: (item.get_closest_marker("restarts_stack") is not None, _needs_an_image(item)))


# The several-client test bed, shaped like a production cluster: three clients, fake GPUs on
# client 3 only, ACLs (default deny) and TLS on Nomad, Consul and OpenBao.
CLUSTER_CLIENTS = 3
CLUSTER_GPUS = 2
CLUSTER_GPU_CLIENT = 3


@pytest.fixture(scope="session")
def secure_cluster():
    """The secure several-client stack: reused when it is up, started (and stopped at the
    end unless NOMADTF_KEEP_STACK=1) otherwise. It never skips."""
    cluster = ClusterStack.default()
    started = cluster.up(
        progress=_progress, clients=CLUSTER_CLIENTS, gpus=CLUSTER_GPUS, gpu_clients=(CLUSTER_GPU_CLIENT,), timeout=180, secure=True,
        docker=TEST_DOCKER,
    )
    yield cluster
    if started and not os.environ.get("NOMADTF_KEEP_STACK"):
        cluster.down(progress=_progress)


@pytest.fixture
def code_server(tmp_path):
    """A zip and a tarball of the probe served on 127.0.0.1, as a user's artifact store."""
    import functools
    import http.server
    import shutil
    import tarfile
    import threading
    import zipfile

    from tests.helpers import JOBS

    root = tmp_path / "served"
    root.mkdir()
    with zipfile.ZipFile(root / "code.zip", "w") as zf:
        zf.write(JOBS / "probe.py", "probe.py")
    with tarfile.open(root / "code.tar.gz", "w:gz") as tf:
        tf.add(JOBS / "probe.py", "probe.py")
    with tarfile.open(root / "jobs.tar.gz", "w:gz") as tf:  # every test job's code
        for path in sorted(JOBS.glob("*.py")):
            tf.add(path, path.name)
    with zipfile.ZipFile(root / "empty.zip", "w") as zf:
        zf.writestr("README", "no code here")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *_args):
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    shutil.rmtree(root, ignore_errors=True)
