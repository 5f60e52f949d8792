"""The ASGI application: admin API under ``{base}/api``, web UI under ``{base}/``, and the
on-demand gateway under ``{base}/ondemand``.

Everything with a lifetime (HTTP client, deployer, background tasks) is built in the lifespan,
inside the running event loop (``dgxmm.assembly``), and torn down in reverse order, engines
included. The lifespan holds the data directory's lock from before the database is opened until
after the last engine is stopped (``dgxmm serve`` takes it earlier still and hands it over).
Long-lived background tasks run under the supervisor (``ctx.supervisor``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.responses import RedirectResponse

from dgxmm.api import errors
from dgxmm.api.guard import AdminGuard
from dgxmm.api.head import HeadAsGet
from dgxmm.api.routes import mount as mount_api
from dgxmm.api.tokens import ViewerTokens
from dgxmm.asgi import OndemandFront
from dgxmm.assembly.context import build_context
from dgxmm.assembly.lifetime import shutdown, start_background_tasks
from dgxmm.datadir import DataDirLock
from dgxmm.declared.endpoint import router as declared_router
from dgxmm.deploy.reconcile import reconcile
from dgxmm.front.connections import ConnectionBudget
from dgxmm.front.limits import FrontLimits, front_limits
from dgxmm.gateway.ratelimit import FailureLimiter
from dgxmm.llamacpp.api import ModelsApi
from dgxmm.ollama.api import OllamaApi
from dgxmm.settings import Settings
from dgxmm.store.db import Store
from dgxmm.telemetry import endpoint
from dgxmm.web import WebUI


def create_app(settings: Settings, store: Store | None = None, lock: DataDirLock | None = None) -> OndemandFront:
    """The application. Without ``store`` the lifespan locks the data directory and opens the
    database itself; with it, ``lock`` is the data directory's lock its caller holds.

    The start-up order: the lock, the database, the parts (``build_context``), the gateway's
    entrance served, the engines found running adopted (``reconcile``), the declared deployments
    applied, the preloads, the peers read, then the background tasks."""
    base = settings.server.base_path
    limits = front_limits(settings.server)
    budget = ConnectionBudget(limits.max_connections, limits.max_head_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        held = lock or DataDirLock.acquire(settings.server.data_dir)
        try:
            db = store or Store(settings.server.data_dir / "dgxmm.db")
            try:
                viewers = app.state.viewers = ViewerTokens(db)
                assembled = build_context(
                    settings, db, (limits, budget), lambda given: viewers.check(given) is not None
                )
                ctx = app.state.ctx = assembled.context
                declared = app.state.declared = assembled.declared
                front.serving(ctx.entrance)
                try:
                    await reconcile(ctx.deployer, ctx.http, ctx.bus)
                    await declared.reload()  # the files as they are now; a bad one changes nothing
                    ctx.ondemand.preload()  # after the always-on ones: a preload takes only what is free
                    await ctx.peers.refresh()
                    if ctx.scrape.public is not None:
                        await ctx.scrape.public.refresh()
                    start_background_tasks(ctx, declared)
                    yield
                finally:
                    front.serving(None)
                    await shutdown(ctx)
            finally:
                db.close()
        finally:
            held.release()

    app = FastAPI(
        title="dgxmm",
        lifespan=lifespan,
        openapi_url=f"{base}/api/openapi.json",
        docs_url=None,  # FastAPI's page loads its scripts from a CDN: dgxmm serves its own (web/api.html)
        redoc_url=None,
    )
    errors.install(app)

    @app.get(f"{base}/api/docs", include_in_schema=False)
    async def api_docs() -> RedirectResponse:
        """The API's reference page, served by dgxmm's UI (no script from elsewhere)."""
        return RedirectResponse(f"{base}/api.html")

    endpoint.install(app, base)  # GET {base}/metrics, before the web UI's mount at {base}
    mount_api(app, f"{base}/api")
    app.include_router(declared_router, prefix=f"{base}/api")
    # The web UI at {base}/, after the API routers so they win; GET {base} redirects to {base}/.
    app.mount(base, WebUI(), name="web")
    open_paths = frozenset({f"{base}/api/openapi.json", f"{base}/api/docs"})
    failures = FailureLimiter(settings.server.admin_token_failures, settings.server.admin_token_window_s)
    admin = AdminGuard(
        HeadAsGet(app),
        f"{base}/api",
        open_paths,
        settings.server.max_admin_body_bytes,
        lambda: str(app.state.ctx.admin_token),
        failures,
        settings.server.body_timeout_s,
        viewer=lambda given: app.state.viewers.check(given) is not None,
    )
    front = _front(settings, app, admin, (limits, budget))  # (the lifespan serves through it)
    return front


def _front(
    settings: Settings, app: FastAPI, admin: AdminGuard, server: tuple[FrontLimits, ConnectionBudget]
) -> OndemandFront:
    """The outermost app: the gateway and the dialects at the root before the admin API."""
    base = settings.server.base_path
    router = settings.router.path if settings.router.enabled else None
    # Ollama's API is the router's requests translated: it needs the router.
    ollama = OllamaApi(settings) if settings.ollama.enabled and router is not None else None
    # llama-swap's unload under /api at the root, unless the admin API is there (no base path).
    models = ModelsApi(router, swap_unload=bool(base)) if settings.router.models_api and router is not None else None
    own = settings.ollama.port  # Ollama's own listener: its requests are told by their local port
    limits, budget = server
    return OndemandFront(app, f"{base}/ondemand", admin, limits, budget, router, ollama, models, own)
