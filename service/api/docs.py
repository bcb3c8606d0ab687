"""The interactive API documentation at /docs, served from this process (no CDN).

FastAPI's default /docs page loads Swagger UI from a CDN, which an air-gapped or locked-down
network cannot reach. The same assets ship in the ``fastapi-offline`` package; they are served
here under /docs/assets. ReDoc, also a CDN page by default, is not offered.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

ASSETS_PATH = "/docs/assets"


def add_docs(app: FastAPI) -> None:
    assets = files("fastapi_offline") / "static"
    app.mount(ASSETS_PATH, StaticFiles(directory=str(assets)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} API",
            swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PATH}/favicon.png",
        )
