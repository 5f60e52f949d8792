"""The real LiteLLM proxy the tests of this folder talk to, given as DGXMM_TEST_LITELLM_URL and
DGXMM_TEST_LITELLM_KEY (its master key); `make test-litellm` and .ci/run start one.

One proxy serves the whole run and keeps its model table between runs, so tests never assume it
is empty, and each test removes the entries of the dgxmm instances it started (``purge``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from dgxmm.litellm.purge import purge
from dgxmm.settings import LiteLLMSettings

URL = os.environ.get("DGXMM_TEST_LITELLM_URL")
MASTER = os.environ.get("DGXMM_TEST_LITELLM_KEY")
needs_litellm = pytest.mark.skipif(
    not (URL and MASTER),
    reason="no real LiteLLM: DGXMM_TEST_LITELLM_URL and DGXMM_TEST_LITELLM_KEY are unset "
    "(make test-litellm starts one)",
)


def litellm_section(folder: Path) -> dict[str, Any]:
    """The [litellm] keys of a dgxmm registering into the test proxy (master key in ``folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    master = folder / "litellm-master.key"
    master.write_text(f"{MASTER}\n")
    return {"enabled": True, "url": URL, "master_key_file": master}


async def model_info() -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=30) as c:
        resp = await c.get(f"{URL}/v2/model/info", headers={"Authorization": f"Bearer {MASTER}"})
        resp.raise_for_status()
        return list(resp.json()["data"])


async def entries_of(instance: str) -> list[dict[str, Any]]:
    return [e for e in await model_info() if (e.get("model_info") or {}).get("dgxmm_instance") == instance]


def proxy_client() -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key=MASTER, base_url=f"{URL}/v1", max_retries=0, timeout=120)


async def purge_instances(folder: Path, *instances: str) -> None:
    """Delete every entry of ``instances`` (what `dgxmm litellm purge --instance` does)."""
    settings = LiteLLMSettings(**litellm_section(folder))
    for instance in instances:
        lines: list[str] = []
        assert await purge(settings, instance, False, False, lines.append), lines
    for instance in instances:
        assert await entries_of(instance) == []
