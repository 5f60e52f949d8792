"""What a viewer token is not shown: the values of a deployment's ``env``.

Operators pass tokens to engines that way (``HF_TOKEN``, an engine's API key), and a viewer
token is for dashboards and teammates who watch (api/tokens.py): it sees each variable's name,
its value as null. Audit rows never keep the values at all (deploy/auditing.py). The admin token
sees the values, to edit them.
"""

from __future__ import annotations

from typing import Any

ADMIN = "admin"  # the user ``auth.require_admin`` names for the admin token


def for_reader(user: str, view: dict[str, Any]) -> dict[str, Any]:
    """``view`` (a deployment's, as ``status.view`` builds it) as ``user`` may read it."""
    env = view.get("env")
    if user == ADMIN or not env:
        return view
    return {**view, "env": dict.fromkeys(env)}


def all_for_reader(user: str, views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return views if user == ADMIN else [for_reader(user, view) for view in views]
