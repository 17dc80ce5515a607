"""``GET /openapi.json``, ``/docs`` (Swagger UI) and ``/redoc``: the API's description.

FastAPI serves these itself and never asks for a key; create_app turns its own off and includes
this router instead, behind the API key when the server has one (unless ``open_docs``), so that
``--api-key`` protects every route but ``/health`` as its help says.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

__all__ = ["router", "OPENAPI_URL"]

OPENAPI_URL = "/openapi.json"

router = APIRouter(include_in_schema=False)


@router.get(OPENAPI_URL)
async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url=OPENAPI_URL, title=f"{request.app.title} - Swagger UI")


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url=OPENAPI_URL, title=f"{request.app.title} - ReDoc")
