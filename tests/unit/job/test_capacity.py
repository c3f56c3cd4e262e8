"""What a job asks and what the cluster holds (capacity.py), on the JSON shapes Nomad 1.6
returns: node stubs of GET /v1/nodes?resources=true, allocations of GET /v1/allocations?resources=true."""

from __future__ import annotations

from nomadtf.job import capacity
from nomadtf.job.answers import Allocation, Node, held_by_job
from nomadtf.job.capacity import Ask, NodeCapacity, Resources
from nomadtf.job.render import render_job
from nomadtf.job.spec import load_spec
from tests.helpers import EXAMPLES

GPU = "nvidia/gpu/Tesla-V100-SXM2-16GB"


def node(node_id="n1", cpu=5200, memory=24105, gpus=0, reserved_cpu=0, status="ready", dc="dc1", pool="default", **extra):
    devices = [{"Vendor": "nvidia", "Type": "gpu", "Name": "Tesla-V100-SXM2-16GB",
                "Instances": [{"ID": f"GPU-{i}", "Healthy": True} for i in range(gpus)]}] if gpus else []
    stub = {
        "ID": node_id, "Name": node_id, "Datacenter": dc, "NodePool": pool, "Status": status,
        "SchedulingEligibility": "eligible", "Drain": False,
        "NodeResources": {"Cpu": {"CpuShares": cpu}, "Memory": {"MemoryMB": memory}, "Devices": devices},
        "ReservedResources": {"Cpu": {"CpuShares": reserved_cpu}, "Memory": {"MemoryMB": 0}},
    }  # fmt: skip
    stub.update(extra)
    return Node.from_api(stub)


def alloc(job="a", ns="default", cpu=1000, memory=500, gpus=0, client="running", desired="run", node_id="n1"):
    devices = [{"Vendor": "nvidia", "Type": "gpu", "Name": "Tesla-V100-SXM2-16GB", "DeviceIDs": [f"GPU-{i}" for i in range(gpus)]}]
    return Allocation.from_api({
        "Namespace": ns, "JobID": job, "NodeID": node_id, "ClientStatus": client, "DesiredStatus": desired,
        "AllocatedResources": {"Tasks": {"t": {"Cpu": {"CpuShares": cpu}, "Memory": {"MemoryMB": memory}, "Devices": devices if gpus else None}}},
    })  # fmt: skip


def test_a_rendered_job_asks_one_allocation_per_count_with_its_devices():
    job = render_job(load_spec(EXAMPLES / "gpu" / "job.json"))
    asks = capacity.job_asks(job)
    workers = [a for a in asks if a.group == "worker"]
    assert len(workers) == 2 and workers[0].resources == Resources(1000, 8192, {"nvidia/gpu": 2})
    assert capacity.job_needs(job).devices == {"nvidia/gpu": sum(a.resources.devices.get("nvidia/gpu", 0) for a in asks)}
    assert capacity.job_asks(job["Job"]) == asks  # the body of POST /v1/jobs or the job itself


def test_device_names_match_as_nomad_reads_them():
    assert capacity.device_matches("gpu", GPU)
    assert capacity.device_matches("nvidia/gpu", GPU)
    assert capacity.device_matches(GPU, GPU)
    assert not capacity.device_matches("amd/gpu", GPU)
    assert not capacity.device_matches("nvidia/gpu/A100", GPU)
    assert not capacity.device_matches("fpga", GPU)


def test_nodes_count_by_status_datacenter_pool_and_less_what_is_reserved():
    stubs = [
        node("a", reserved_cpu=200),
        node("down", status="down"),
        node("drained", Drain=True),
        node("ineligible", SchedulingEligibility="ineligible"),
        node("other-dc", dc="eu-1"),
        node("gpu-pool", pool="gpu"),
    ]
    nodes = capacity.node_capacities(stubs, {"Datacenters": ["dc*"]})
    assert [n.node_id for n in nodes] == ["a"] and nodes[0].resources.cpu == 5000
    assert {n.node_id for n in capacity.node_capacities(stubs, {"Datacenters": ["*"], "NodePool": "all"})} == {"a", "other-dc", "gpu-pool"}
    assert [n.node_id for n in capacity.node_capacities(stubs, {"Job": {"Datacenters": ["*"], "NodePool": "gpu"}})] == ["gpu-pool"]


def nodes_of(*stubs):
    return capacity.node_capacities(stubs, {"Datacenters": ["*"]})


def test_a_job_fits_an_empty_cluster_when_first_fit_packs_it():
    two = nodes_of(node("a", cpu=4000), node("b", cpu=4000))
    assert capacity.fits_when_empty([Ask("w", Resources(3000, 100))] * 2, two)
    assert not capacity.fits_when_empty([Ask("w", Resources(3000, 100))] * 3, two)  # one per node, whatever the total
    assert not capacity.fits_when_empty([Ask("w", Resources(4500, 100))], two)  # bigger than any node
    assert not capacity.fits_when_empty([Ask("w", Resources(100, 30000))], two)


def test_devices_pack_per_node_and_per_request():
    gpus = nodes_of(node("a", gpus=6))
    assert capacity.fits_when_empty([Ask("w", Resources(100, 100, {"nvidia/gpu": 6}))], gpus)
    assert not capacity.fits_when_empty([Ask("w", Resources(100, 100, {"nvidia/gpu": 6}))] * 2, gpus)  # 12 of 6
    assert not capacity.fits_when_empty([Ask("w", Resources(100, 100, {"amd/gpu": 1}))], gpus)
    split = nodes_of(node("a", gpus=2), node("b", gpus=2))
    assert not capacity.fits_when_empty([Ask("w", Resources(100, 100, {"gpu": 3}))], split)  # 4 in all, never 3 on one node
    assert capacity.fits_when_empty([Ask("w", Resources(100, 100, {"gpu": 2}))] * 2, split)


def test_only_allocations_that_hold_resources_count_and_by_job():
    allocs = [
        alloc("a", cpu=1000), alloc("a", cpu=500, client="pending"), alloc("b", ns="team-b", cpu=700, gpus=2),
        alloc("c", cpu=9000, client="complete"), alloc("d", cpu=9000, client="lost"), alloc("e", cpu=9000, client="failed"),
        alloc("f", cpu=9000, client="complete", desired="stop"),
        alloc("g", cpu=300, desired="stop"),  # told to stop, its tasks not ended yet: still holds
    ]  # fmt: skip
    used = held_by_job(allocs)
    assert used == {("default", "a"): Resources(1500, 1000), ("team-b", "b"): Resources(700, 500, {GPU: 2}), ("default", "g"): Resources(300, 500)}


def test_free_capacity_and_the_dimensions_short():
    cluster = capacity.cluster_capacity(nodes_of(node("a", gpus=6)))
    free = capacity.subtract(cluster, Resources(4000, 1000, {GPU: 5}))
    assert free == Resources(1200, 23105, {GPU: 1})
    assert capacity.short_of(Resources(2000, 100, {"nvidia/gpu": 2}), free) == ["cpu", "nvidia/gpu"]
    assert capacity.short_of(Resources(1000, 100), free) == []
    assert Resources(3380, 1800, {"nvidia/gpu": 2}).describe() == "cpu 3380 MHz, memory 1800 MB, nvidia/gpu x2"


def test_largest_node_is_per_dimension():
    nodes = [NodeCapacity("a", "a", Resources(8000, 1000)), NodeCapacity("b", "b", Resources(2000, 64000))]
    assert capacity.largest_node(nodes) == Resources(8000, 64000)


def test_the_shortfall_is_what_free_lacks_of_the_needs_per_dimension():
    free = Resources(1820, 22305, {GPU: 1})
    assert capacity.shortfall(Resources(3380, 1800, {"nvidia/gpu": 2}), free) == Resources(1560, 0, {"nvidia/gpu": 1})
    assert capacity.shortfall(Resources(100, 100, {"nvidia/gpu": 1}), free) == Resources()
