"""``POST /webhooks/github``: read the body within GitHub's size limit, hand it to the processor.

The route stays lean: no dependencies, the raw body read once and fed into the HMAC as it arrives,
the decision made on the event loop (JSON, validation: well under a millisecond for a normal
payload; a worker thread for a large one) and the one database write shared with concurrent
requests (:class:`service.github.recorder.DeliveryRecorder`).

The webhook's limit is ``AMPCI_WEBHOOK_MAX_BODY_BYTES`` (default 25 MiB: GitHub sends push payloads
up to 25 MB, e.g. 2,048 commits with their file lists), not the JSON API's ``AMPCI_MAX_BODY_BYTES``.
A request without a well-formed signature header is answered 401 before a byte of its body is read;
nothing is parsed or stored before the streamed signature matched (:mod:`service.github.webhook`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.api.context import app_context
from service.github.recorder import DeliveryRecorder
from service.github.signature import SignatureStream

router = APIRouter(tags=["webhook"])

_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


async def read_limited(request: Request, limit: int,
                       mac: SignatureStream | None = None) -> tuple[bytes | None, bool]:
    """(body, too_large): stops reading as soon as more than ``limit`` bytes arrived; each chunk is
    fed to ``mac`` as it arrives."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        return None, True
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None, True
        if mac is not None:
            mac.update(chunk)
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
    ctx = app_context(request)
    settings = ctx.settings
    body: bytes | None = None
    too_large = False
    signed: bool | None = None
    if ctx.webhook.signature_present(request.headers):  # else 401 from the headers alone, the body unread
        mac = SignatureStream(settings.webhook_secret) if settings.webhook_secret else None
        body, too_large = await read_limited(request, settings.webhook_max_body_bytes, mac)
        if mac is not None and body is not None:
            signed = mac.matches(request.headers.get("x-hub-signature-256"))
    if ctx.recorder is None:
        ctx.recorder = DeliveryRecorder(ctx.store)
    outcome = await ctx.webhook.handle_async(request.headers, body, too_large, recorder=ctx.recorder,
                                             signed=signed)
    return JSONResponse(outcome.body, status_code=outcome.status_code)
