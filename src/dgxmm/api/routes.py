"""The admin API's routes, mounted by the API itself in the order they must be tried."""

from __future__ import annotations

from fastapi import FastAPI

from dgxmm.api.activity import router as activity_router
from dgxmm.api.deployments import router as deployments_router
from dgxmm.api.estimate import router as estimate_router
from dgxmm.api.host import router as host_router
from dgxmm.api.keys import router as keys_router
from dgxmm.api.playground import router as playground_router
from dgxmm.api.serverlog import router as server_log_router
from dgxmm.api.storedmodels import router as models_router
from dgxmm.api.tokens import router as tokens_router
from dgxmm.api.waiting import router as waiting_router

# The playground's before POST /deployments/{id}/{action}, which would take its paths.
ROUTERS = (
    playground_router,
    waiting_router,
    deployments_router,
    host_router,
    models_router,
    estimate_router,
    activity_router,
    keys_router,
    tokens_router,
    server_log_router,
)


def mount(app: FastAPI, prefix: str) -> None:
    """Every admin route under ``prefix`` (``{base}/api``)."""
    for router in ROUTERS:
        app.include_router(router, prefix=prefix)
