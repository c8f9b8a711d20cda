"""What the etcd store relies on in etcd3gw against etcd 3.4's JSON gateway (checked here against
the real server, so that another etcd or etcd3gw that answers otherwise fails here first)."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import Etcd3Exception
from etcd3gw.lease import Lease

from tests.fleetstores import EtcdServer
from tests.integration.coordination.conftest import new_prefix

pytestmark = pytest.mark.real


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture
def client(etcd: EtcdServer) -> Iterator[Etcd3Client]:
    c = Etcd3Client(host="127.0.0.1", port=etcd.port, timeout=5)  # no api_path: discovered
    yield c
    c.session.close()


def test_the_api_path_etcd3gw_discovers_is_the_one_given(client: Etcd3Client) -> None:
    assert client.api_path == "/v3/"  # from /version: etcdserver 3.4.x


def test_a_transaction_s_revision_is_its_keys_create_revision(client: Etcd3Client) -> None:
    key = new_prefix("gateway") + "k"
    done = client.transaction(
        {
            "compare": [{"key": b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": {"key": b64(key), "value": b64("v")}}],
            "failure": [],
        }
    )
    assert done.get("succeeded") is True
    ((_, meta),) = client.get(key, metadata=True)
    assert meta["create_revision"] == done["header"]["revision"]
    # A compare that fails: proto3's JSON leaves out `succeeded: false` altogether.
    again = client.transaction(
        {
            "compare": [{"key": b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": {"key": b64(key), "value": b64("w")}}],
            "failure": [],
        }
    )
    assert "succeeded" not in again
    assert client.get(key) == [b"v"]


def test_an_ended_lease_cannot_be_kept_alive_nor_given_keys(client: Etcd3Client) -> None:
    lease = client.lease(30)
    assert lease.refresh() == 30
    lease.revoke()
    assert Lease(lease.id, client).refresh() == -1  # no TTL in the answer
    with pytest.raises(Etcd3Exception) as raised:
        client.put(new_prefix("gateway") + "k", "v", lease=lease)
    assert "requested lease not found" in (raised.value.detail_text or "")
