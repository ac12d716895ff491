"""``POST /webhooks/github``: read the body within the size limit, hand it to the processor.

The route stays lean: no dependencies, the raw body read once, the decision made on the event
loop (signature, JSON, validation: well under a millisecond for a normal payload) and the one
database write shared with concurrent requests (:class:`service.github.recorder.DeliveryRecorder`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.github.recorder import DeliveryRecorder

router = APIRouter(tags=["webhook"])

_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


async def read_limited(request: Request, limit: int) -> tuple[bytes | None, bool]:
    """(body, too_large): stops reading as soon as more than ``limit`` bytes arrived."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        return None, True
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None, True
        chunks.append(chunk)
    return b"".join(chunks), False


@router.post(
    "/webhooks/github",
    summary="GitHub webhook (push, pull_request, ping)",
    description="Verifies X-Hub-Signature-256, validates the payload, deduplicates on X-GitHub-Delivery "
                "and stores the delivery; the run is created and enqueued right after, off the request "
                "path (GET /api/deliveries/{id} shows its run). Never runs jobs itself.",
    responses={200: {"description": "ping answered or duplicate delivery"},
               202: {"description": "run queued, or event ignored"},
               400: {"description": "malformed delivery (recorded as rejected)", **_ERROR},
               401: {"description": "missing or wrong signature (nothing stored)", **_ERROR},
               403: {"description": "repository not allowed (recorded as rejected)", **_ERROR}},
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"type": "object", "additionalProperties": True}}}},
        "parameters": [
            {"name": "X-GitHub-Event", "in": "header", "required": True, "schema": {"type": "string"}},
            {"name": "X-GitHub-Delivery", "in": "header", "required": True, "schema": {"type": "string"}},
            {"name": "X-Hub-Signature-256", "in": "header", "required": True, "schema": {"type": "string"}},
        ]},
)
async def github_webhook(request: Request) -> JSONResponse:
    ctx = request.app.state.ctx
    body, too_large = await read_limited(request, ctx.settings.max_body_bytes)
    if ctx.recorder is None:
        ctx.recorder = DeliveryRecorder(ctx.store)
    outcome = await ctx.webhook.handle_async(request.headers, body, too_large, recorder=ctx.recorder)
    return JSONResponse(outcome.body, status_code=outcome.status_code)
