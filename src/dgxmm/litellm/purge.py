"""``dgxmm litellm purge``: retire the LiteLLM entries of a dgxmm host that is gone for good.

A live dgxmm keeps only its own entries in step (``sync.owned``), so the entries of a host
that died or was rebuilt with a new data directory stay in LiteLLM until someone removes them:
by instance id (``--instance``), or, for entries an older dgxmm wrote without an instance id that
no live host adopted, all of those at once (``--legacy``). Entries made by hand are never touched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp

from dgxmm.litellm.api import LiteLLMAdmin, SyncError
from dgxmm.settings import LiteLLMSettings


def selected(entries: list[dict[str, Any]], instance: str | None, legacy: bool) -> list[dict[str, Any]]:
    """The dgxmm entries of ``instance``, plus with ``legacy`` those that carry no instance."""
    chosen = []
    for entry in entries:
        info = entry.get("model_info") or {}
        if not info.get("dgxmm_id"):
            continue
        mark = info.get("dgxmm_instance")
        if (instance is not None and mark == instance) or (legacy and mark is None):
            chosen.append(entry)
    return chosen


def describe(entry: dict[str, Any]) -> str:
    info = entry.get("model_info") or {}
    owner = info.get("dgxmm_instance") or "no instance"
    return f"{entry.get('model_name')} (entry {info.get('id')}, deployment {info.get('dgxmm_id')}, {owner})"


async def purge(
    settings: LiteLLMSettings, instance: str | None, legacy: bool, dry_run: bool, say: Callable[[str], None]
) -> bool:
    """Delete (or with ``dry_run`` list) the chosen entries; False when any call failed."""
    async with aiohttp.ClientSession() as http:
        admin = LiteLLMAdmin(settings, http)
        try:
            master = admin.master_key()
            victims = selected(await admin.entries(master), instance, legacy)
        except (SyncError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            say(f"error: cannot read LiteLLM's entries: {exc}")
            return False
        if not victims:
            say("no entries matched")
        ok = True
        for entry in victims:
            if dry_run:
                say(f"would delete {describe(entry)}")
                continue
            try:
                await admin.delete(master, entry["model_info"]["id"])
            except (SyncError, aiohttp.ClientError, TimeoutError, OSError) as exc:
                say(f"error: {describe(entry)}: {exc}")
                ok = False
                continue
            say(f"deleted {describe(entry)}")
        return ok
