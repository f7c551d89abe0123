"""OpenAI-compatible HTTP server: ``mistral-kernels serve`` (needs the ``serve`` extra: fastapi, uvicorn,
prometheus_client).

=====================  ==========================================================================
module                 role
=====================  ==========================================================================
:mod:`.args`           the ``serve`` command-line flags (importable without the extra)
:mod:`.protocol`       request bodies (pydantic), response shapes
:mod:`.errors`         OpenAI-format errors, 400 naming the bad field
:mod:`.async_engine`   the engine loop in a background thread, per-request event queues
:mod:`.metrics`        Prometheus metrics
:mod:`.app`            the FastAPI app (endpoints, server-sent events)
:mod:`.tool_calls`     the chat body's tools → :mod:`mistral_kernels.tools.chat` (400s naming the field)
:mod:`.server`         load the model, run uvicorn, graceful shutdown on SIGINT / SIGTERM
:mod:`.tp`             ``--tp N``: rank 0 broadcasts its engine operations, the other ranks follow
=====================  ==========================================================================

Importing this package does not import fastapi; :mod:`.app` and :mod:`.server` do.
"""
