"""Finding dgxmm's own container from /proc/self/mountinfo, without guessing."""

from __future__ import annotations

from dgxmm.deploy.runtimes.dockerself import container_id_from

CID = "f389c7463923bddcc88065215dbde7ce014b7249d521a9a0d0018056bf8d7da3"
IN_CONTAINER = f"""\
1021 1003 0:112 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/X
1031 1021 254:1 /var/lib/docker/containers/{CID}/resolv.conf /etc/resolv.conf rw,relatime - ext4 /dev/vda rw
1032 1021 254:1 /var/lib/docker/containers/{CID}/hostname /etc/hostname rw,relatime - ext4 /dev/vda rw
1033 1021 254:1 /var/lib/docker/containers/{CID}/hosts /etc/hosts rw,relatime - ext4 /dev/vda rw
"""
ON_HOST = """\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
26 22 0:23 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
"""


def test_own_container_is_found_from_its_mounts() -> None:
    assert container_id_from(IN_CONTAINER) == CID


def test_on_the_host_there_is_no_container() -> None:
    assert container_id_from(ON_HOST) is None


def test_mounts_of_two_different_containers_are_not_a_guess() -> None:
    other = CID[::-1]
    mixed = IN_CONTAINER + f"9 1 254:1 /var/lib/docker/containers/{other}/hosts /mnt/x rw - ext4 /dev/vda rw\n"
    assert container_id_from(mixed) is None


def test_a_custom_data_root_still_matches() -> None:
    custom = IN_CONTAINER.replace("/var/lib/docker/", "/srv/docker-data/")
    assert container_id_from(custom) == CID
