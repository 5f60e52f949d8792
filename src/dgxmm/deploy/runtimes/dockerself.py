"""Where dgxmm itself runs: its own container, if any (the peer policy reads that container's
networks through ``gateway/dockernetworks.py``).

Docker bind-mounts ``/etc/hostname``, ``/etc/hosts`` and ``/etc/resolv.conf`` from
``<data-root>/containers/<id>/`` into every container, so ``/proc/self/mountinfo`` names our
container id without guessing from the hostname (which users may set). The id is then confirmed
through the Docker API; a process on the host finds no such mount and is not in a container.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

_MOUNT = re.compile(r"/containers/([0-9a-f]{64})/(?:hostname|hosts|resolv\.conf)\s")


def container_id_from(mountinfo: str) -> str | None:
    ids = {match.group(1) for match in _MOUNT.finditer(mountinfo)}
    return ids.pop() if len(ids) == 1 else None


@cache
def own_container_id(mountinfo: Path = Path("/proc/self/mountinfo")) -> str | None:
    try:
        return container_id_from(mountinfo.read_text())
    except OSError:
        return None


def in_container() -> bool:
    return own_container_id() is not None
