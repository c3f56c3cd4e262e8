"""The pure parts of nomad.py, the Nomad adapter: what /v1/agent/members says about the
servers' versions (the real call runs in tests/stack/test_profile.py)."""

from __future__ import annotations

from nomadtf.servers.nomad import NomadAPI
from nomadtf.servers.nomadhttp import NomadSettings


def _member(name: str, build: str, region: str, status: str = "alive") -> dict:
    return {"Name": name, "Status": status, "Tags": {"build": build, "region": region, "role": "nomad"}}


def test_the_servers_versions_are_this_regions_live_servers_only(monkeypatch):
    api = NomadAPI(NomadSettings(address="http://127.0.0.1:1"))
    members = {
        "ServerRegion": "eu",
        "Members": [
            _member("a.eu", "1.10.5", "eu"),
            _member("b.eu", "1.11.3", "eu"),
            _member("c.eu", "1.6.1", "eu", status="left"),  # gone: decides nothing
            _member("a.us", "1.5.0", "us"),  # another federated region's server
        ],
    }
    monkeypatch.setattr(api, "_json", lambda *args, **kwargs: members)
    assert api.server_versions() == ["1.10.5", "1.11.3"]
