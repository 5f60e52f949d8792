"""A hostile hub against a served dgxmm (issue 47 items 6 and 7), replayed with the Hub's client as
dgxmm runs it (its own 10 MB pieces): a file that grows past its listed size fails at that size
with nothing of it kept; sizes that are no file's refuse the pull before any byte; a redirect to
another host, or to dgxmm's own admin API, fails the pull without being followed; a viewer token
cannot make dgxmm ask the hub."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from served import Served, until

from hub.server import MISSING, Bystander, FakeHub

pytestmark = pytest.mark.hostile
MIB = 1024 * 1024
LISTED = 1000  # the finding: a file listed at 1,000 bytes was written to 73 MB
GROWS = 200 * MIB
# What dgxmm reads of a growing file before it refuses it: one 10 MB piece of the Hub's client,
# and the socket buffers of both ends (a few MiB each); far below the 200 MiB on offer.
READ_BOUND = 48 * MIB


@dataclass
class Site:
    served: Served
    hub: FakeHub
    elsewhere: Bystander  # on another address
    other_port: Bystander  # on the hub's address, another port

    def models_dir(self, repo: str) -> Path:
        return self.served.data_dir / "models" / f"models--{repo.replace('/', '--')}"

    def pull(self, repo: str) -> dict[str, Any]:
        """POST /api/models, then the record once it is no longer downloading."""
        with self.served.admin() as admin:
            answer = admin.post("/models", json={"repo": repo})
            assert answer.status_code in (200, 202), answer.text
            model = answer.json()["id"]
            return dict(until(lambda: settled(admin.get(f"/models/{model}").json()), timeout=60))


def settled(record: dict[str, Any]) -> dict[str, Any] | None:
    return record if record["status"] != "downloading" else None


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("hostile-hub")
    hub = FakeHub().start()
    elsewhere, other_port = Bystander("127.0.0.3").start(), Bystander().start()
    env = {
        "DGXMM_MODELS__HUB_URL": hub.url,
        "DGXMM_MODELS__REDIRECT_HOSTS": json.dumps(hub.redirect_hosts),
        "DGXMM_MODELS__RESERVE_GIB": "0",
        "DGXMM_SERVER__LOG_LEVEL": "warning",
    }
    served = Served(tmp, env).start()
    try:
        yield Site(served, hub, elsewhere, other_port)
    finally:
        served.stop()
        for server in (hub, elsewhere, other_port):
            server.close()


def test_a_file_that_grows_past_its_listed_size_fails_at_that_size_and_is_not_kept(site: Site) -> None:
    site.hub.add("evil/grows", {"model.gguf": bytes(range(256)) * 3 + bytes(232)}, grows={"model.gguf": GROWS})
    record = site.pull("evil/grows")
    assert record["status"] == "failed", record
    assert record["error"] == f"model.gguf: the hub sent more than the {LISTED} bytes it lists; the file was not kept"
    assert record["bytes_done"] == 0
    assert list((site.models_dir("evil/grows") / "blobs").iterdir()) == []  # not a byte on disk
    sent = until(lambda: site.hub.sent.get("model.gguf"), timeout=30)
    assert sent < READ_BOUND, f"{sent / MIB:.1f} MiB sent before dgxmm stopped reading"


@pytest.mark.parametrize("listed", [-1, MISSING, 10**15], ids=["negative", "missing", "absurd"])
def test_a_size_that_is_no_files_refuses_the_pull_before_any_byte(site: Site, listed: object) -> None:
    """The finding: a sibling listed at a negative size made the total negative and passed the
    space check. (An LFS file's size left out, huggingface_hub itself cannot read the listing.)"""
    repo = f"evil/size-{len(site.hub.repos)}"
    lied = "small.json" if listed is MISSING else "big.bin"  # (an LFS file, its size listed twice)
    files = {"model.gguf": bytes(2000), "big.bin": bytes(100), "small.json": bytes(10)}
    site.hub.add(repo, files, listed={lied: listed})
    record = site.pull(repo)
    assert record["status"] == "failed" and f"the hub lists {lied} in {repo} at" in record["error"]
    assert "which is no file's size" in record["error"], record
    assert site.hub.gets(f"/{repo}/resolve/") == [] and not site.models_dir(repo).exists()


@pytest.mark.parametrize("target", ["another address", "another port", "dgxmm's own admin API"])
@pytest.mark.parametrize("what", ["model.gguf", "info"])
def test_a_redirect_to_another_host_fails_the_pull_without_being_followed(site: Site, target: str, what: str) -> None:
    """The file's ``resolve`` (or the model info) answered with a 302 elsewhere: the pull fails
    saying where it was sent and that it did not go there; the other server got no request (the
    finding: dgxmm's own admin API was fetched and its status echoed in the model's error)."""
    url = {
        "another address": site.elsewhere.url,
        "another port": site.other_port.url,
        "dgxmm's own admin API": f"http://127.0.0.1:{site.served.port}",
    }[target]
    repo = f"evil/redirect-{len(site.hub.repos)}"
    site.hub.add(repo, {"model.gguf": bytes(2000)}, redirect={what: f"{url}/dgxmm/api/host?sig=s3cret"})
    record = site.pull(repo)
    assert record["status"] == "failed", record
    said = f"redirected to {url}, which is neither the hub's host nor one of [models] redirect_hosts: not followed"
    assert said in record["error"] and "s3cret" not in record["error"], record["error"]
    assert site.elsewhere.seen == site.other_port.seen == []


def test_a_viewer_cannot_make_dgxmm_ask_the_hub_and_still_reads_what_was_pulled(site: Site) -> None:
    site.hub.add("org/private", {"model.gguf": bytes(2000)}, token="hf_operator", private=True)
    site.hub.add("org/plain", {"model.gguf": bytes(2000)})
    pulled = site.pull("org/plain")
    assert pulled["status"] == "ready", pulled
    with site.served.admin() as admin:
        made = admin.post("/tokens", json={"name": "watcher", "role": "viewer"}).json()
    asked = len(site.hub.seen)
    with httpx.Client(
        base_url=site.served.base + "/api", headers={"Authorization": f"Bearer {made['token']}"}, timeout=30
    ) as viewer:
        for params in ({"repo": "org/private"}, {"repo": "org/private", "revision": "main", "include": "*"}):
            refused = viewer.get("/models/files", params=params)
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["code"] == "forbidden"
        assert site.hub.seen[asked:] == []
        assert viewer.get(f"/models/{pulled['id']}").json()["id"] == pulled["id"]
        assert pulled["id"] in [m["id"] for m in viewer.get("/models").json()]
