"""The several-client stack's layout and shape (nomadtf/devstack/layout.py) and what `up`
says when another shape runs (cluster.py). No server runs."""

from __future__ import annotations

import pytest

from nomadtf.devstack import cluster as cluster_mod
from nomadtf.devstack import layout, netns, wiring
from nomadtf.devstack.cluster import ClusterStack
from nomadtf.errors import DevStackError


def test_gpu_clients_choose_which_clients_get_fake_gpus():
    assert layout.gpu_client_set(3, 2, None) == (1, 2, 3)
    assert layout.gpu_client_set(3, 2, (3,)) == (3,)
    assert layout.gpu_client_set(3, 0, None) == ()
    assert layout.parse_client_list("3,1") == (3, 1)
    with pytest.raises(DevStackError, match="clients 1..3, not 4"):
        layout.gpu_client_set(3, 2, (4,))
    with pytest.raises(DevStackError, match="needs --gpus"):
        layout.gpu_client_set(3, 0, (3,))
    with pytest.raises(DevStackError, match="comma-separated"):
        layout.parse_client_list("three")
    assert layout.describe_shape(3, 2, (3,)) == "3 clients with 2 fake GPUs on client 3"
    assert layout.describe_shape(3, 0, ()) == "3 clients without fake GPUs"
    assert layout.up_command(3, 2, (3,)) == "nomadtf dev up --clients 3 --gpus 2 --gpu-clients 3"
    assert layout.up_command(3, 2, (1, 2, 3)) == "nomadtf dev up --clients 3 --gpus 2"


def test_a_gpu_client_carries_meta_nomadtf_gpu_true_and_the_others_false(tmp_path):
    gpu = layout.machine("client", 3, state_dir=tmp_path, gpus=2)
    cpu = layout.machine("client", 1, state_dir=tmp_path)
    assert 'nomadtf_gpu = "true"' in wiring.nomad_config(gpu) and "nomadtf-fake-gpu" in wiring.nomad_config(gpu)
    assert 'nomadtf_gpu = "false"' in wiring.nomad_config(cpu) and "nomadtf-fake-gpu" not in wiring.nomad_config(cpu)


def test_another_shape_is_refused_with_the_command_that_builds_the_wanted_one(tmp_path, monkeypatch):
    """A developer's cluster without GPUs, asked for the GPU shape: a clear error naming the fix.
    The same shape is left as it runs; `up` only makes sure its admission controller leads."""
    stack = ClusterStack(tmp_path)
    stack.record.save(clients=3, gpus=0, gpu_clients=[])
    monkeypatch.setattr(cluster_mod.os, "geteuid", lambda: 0)
    monkeypatch.setattr(ClusterStack, "is_up", lambda self: True)
    ensured = []
    monkeypatch.setattr(cluster_mod.controller, "ensure_controller", lambda stack, progress, secure=False: ensured.append((stack, secure)))
    with pytest.raises(DevStackError) as err:
        stack.up(lambda _m: None, clients=3, gpus=2, gpu_clients=(3,))
    assert str(err.value) == (
        "the several-client stack runs 3 clients without fake GPUs, not 3 clients with 2 fake GPUs on client 3; "
        "`nomadtf dev down --cluster`, then `nomadtf dev up --clients 3 --gpus 2 --gpu-clients 3`"
    )
    assert ensured == []  # refused: nothing was deployed
    assert stack.up(lambda _m: None, clients=3, gpus=None) is False  # `dev up --clients 3`: as it runs
    assert ensured == [(stack, False)]


def test_a_shape_gives_each_client_its_gpus_and_says_itself():
    shape = layout.Shape(3, 2, (3,), secure=True)
    assert [shape.gpus_on(i) for i in (1, 2, 3)] == [0, 0, 2]
    assert shape.describe() == "3 clients with 2 fake GPUs on client 3"
    assert shape.describe(with_security=True) == "3 clients with 2 fake GPUs on client 3 with ACLs and TLS"
    assert shape.up_command() == "nomadtf dev up --clients 3 --secure --gpus 2 --gpu-clients 3"
    assert layout.Shape.from_record({"clients": 2, "gpus": 0, "gpu_clients": [1]}) == layout.Shape(2, 0, ())


def test_the_shape_in_words_says_acls_and_tls():
    assert layout.describe_shape(3, 2, (1, 2, 3), secure=True) == "3 clients with 2 fake GPUs each with ACLs and TLS"
    assert layout.describe_shape(3, 2, (2, 3)) == "3 clients with 2 fake GPUs on clients 2, 3"
    assert layout.up_command(2, 0, (), secure=True) == "nomadtf dev up --clients 2 --secure"


def test_a_shape_with_docker_says_so_and_asks_for_it():
    shape = layout.Shape(3, 2, (3,), secure=True, docker=True)
    assert shape.describe() == "3 clients with 2 fake GPUs on client 3, each with its Docker daemon"
    assert shape.up_command() == "nomadtf dev up --clients 3 --secure --docker --gpus 2 --gpu-clients 3"
    assert layout.Shape.from_record({"clients": 3, "gpus": 2, "gpu_clients": [3], "secure": True, "docker": True}) == shape
    assert layout.Shape.from_record({"clients": 3}).docker is False  # a record from before --docker


def test_the_machines_are_where_the_network_puts_them(tmp_path):
    server = layout.machine("server", state_dir=tmp_path)
    assert (server.address, server.servers, server.state_dir) == (netns.SERVER_IP, (netns.SERVER_IP,), tmp_path / "server")
    client = layout.machine("client", 2, state_dir=tmp_path)
    assert (client.address, client.servers, client.name) == (netns.client_ip(2), (netns.SERVER_IP,), "client-2")
    assert client.network_interface == netns.CLIENT_INTERFACE
    with pytest.raises(DevStackError, match="from 1 to 200"):
        layout.machine("client", 0)
    with pytest.raises(DevStackError, match="not on the server machine"):
        layout.machine("server", gpus=1)
    with pytest.raises(DevStackError, match="--servers is for a client"):
        layout.machine("server", servers=["10.0.0.1"])


def test_agent_names_and_the_client_they_belong_to():
    assert layout.agent_names(2) == ("consul-client-2", "nomad-client-2")
    assert [layout.client_index(n) for n in ("consul-client-2", "nomad-client-12", "consul", "nomad", "openbao")] == [2, 12, None, None, None]


def test_the_urls_are_https_on_the_secure_stack():
    assert layout.urls(False) == {
        "nomad": f"http://{netns.SERVER_IP}:4646",
        "consul": f"http://{netns.SERVER_IP}:8500",
        "vault": f"http://{netns.SERVER_IP}:8200",
    }
    assert set(layout.urls(True).values()) == {f"https://{netns.SERVER_IP}:{p}" for p in (4646, 8501, 8200)}


def test_a_stack_without_a_record_is_down_and_shows_nothing(tmp_path):
    stack = ClusterStack(tmp_path / "none")
    assert not stack.is_up() and stack.components() == [] and stack.status().rows == ()
    assert stack.shape() == layout.Shape(0, 0, (), False)
    with pytest.raises(DevStackError, match="run `nomadtf dev up --clients N`"):
        stack.env()


def test_a_record_from_before_gpu_clients_means_every_client(tmp_path):
    stack = ClusterStack(tmp_path)
    stack.record.path.write_text('{"components": [], "clients": 3, "gpus": 2}')
    assert stack.shape() == layout.Shape(3, 2, (1, 2, 3)) and stack.shape().gpus_on(2) == 2


def test_the_stack_api_of_a_plain_stack_has_no_credentials_but_openbaos_token(tmp_path):
    stack = ClusterStack(tmp_path)
    stack.record.save(clients=2, secure=False)
    stack.token_path.write_text("root\n")
    api = stack.api()
    assert api.urls == layout.urls(False) and api.ca_file is None and api.nomad_token is None
    assert api.vault_token == "root" and "root" not in repr(api)


def test_up_without_gpus_or_docker_means_as_the_running_stack_has_them():
    running = layout.Shape(3, 2, (3,), True, True)
    assert layout.wanted_shape(running, 3, None, None, True, None) == running
    assert layout.wanted_shape(None, 3, None, None, False, None) == layout.Shape(3, 0, (), False, False)
    # Asked for explicitly, they win over the running stack's (and `up` then names the difference).
    assert layout.wanted_shape(running, 3, 1, None, True, False) == layout.Shape(3, 1, (1, 2, 3), True, False)
