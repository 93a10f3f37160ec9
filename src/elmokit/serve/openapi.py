"""The OpenAPI schema of `elmokit serve` (``GET /openapi.json``; docs/openapi.json is a copy, and a
test holds them equal). Written by hand beside the handlers: every answer the app gives, errors
included, is in it (the tests fuzz the app against it).

    python -m elmokit.serve.openapi > docs/openapi.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

from .._version import __version__

__all__: list[str] = []

_REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _object(required: list[str], properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    """A JSON object with the ``required`` keys of ``properties`` (``more``: further keywords)."""
    return {"type": "object", "required": required, "properties": properties, **more}


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


_STRING = {"type": "string"}
_INTEGER = {"type": "integer"}
_NUMBER = {"type": "number"}
_BOOLEAN = {"type": "boolean"}
_TOKENS = _array(_STRING)
_SENTENCES = {
    "description": "one text, or a list of texts and token lists",
    "oneOf": [_STRING, _array({"oneOf": [_STRING, _TOKENS]})],
}
_MODEL = {"type": "string", "description": "a model's name (GET /v1/models); default: the first served"}
_TRUNCATE = {
    "type": "boolean",
    "description": "cut a sentence to --max-input-tokens tokens and a token to --max-token-chars "
    "characters instead of a 413 (default: the server's --truncate)",
}
_ENCODING = {"type": "string", "enum": ["float", "base64"], "default": "float"}
_TIMING = {
    "x-request-id": {"description": "the request's id", "schema": _STRING},
    "x-queue-time": {"description": "milliseconds queued before the model ran", "schema": _STRING},
    "x-inference-time": {"description": "milliseconds of the model's batch", "schema": _STRING},
}

_SCHEMAS: dict[str, Any] = {
    "Error": _object(
        ["error"],
        {
            "error": _object(
                ["message", "type", "param", "code"],
                {
                    "message": _STRING,
                    "type": _STRING,
                    "param": {"type": ["string", "null"]},
                    "code": _INTEGER,
                    "request_id": _STRING,
                },
            )
        },
    ),
    "EmbeddingsRequest": _object(
        ["input"],
        {
            "input": _SENTENCES,
            "model": _MODEL,
            "encoding_format": _ENCODING,
            "layers": {"type": "string", "enum": ["average", "top"], "default": "average"},
            "dimensions": {"type": "integer", "description": "only the model's size"},
            "normalize": {"type": "boolean", "default": True, "description": "unit-length vectors"},
            "truncate": _TRUNCATE,
        },
    ),
    "EmbeddingsResponse": _object(
        ["object", "data", "model", "usage"],
        {
            "object": {"const": "list"},
            "data": _array(
                _object(
                    ["object", "index", "embedding"],
                    {
                        "object": {"const": "embedding"},
                        "index": _INTEGER,
                        "embedding": {
                            "oneOf": [
                                _array(_NUMBER),
                                {"type": "string", "description": "base64 of little-endian float32"},
                            ]
                        },
                    },
                )
            ),
            "model": _STRING,
            "usage": _object(
                ["prompt_tokens", "total_tokens"], {"prompt_tokens": _INTEGER, "total_tokens": _INTEGER}
            ),
        },
    ),
    "EmbedRequest": _object(
        ["sentences"],
        {
            "sentences": _SENTENCES,
            "model": _MODEL,
            "layers": {"type": "string", "enum": ["all", "top", "average"], "default": "all"},
            "encoding_format": _ENCODING,
            "truncate": _TRUNCATE,
        },
    ),
    "EmbedResponse": _object(
        ["model", "layers", "results"],
        {
            "model": _STRING,
            "layers": _STRING,
            "results": _array(
                _object(
                    ["tokens", "shape", "embedding"],
                    {
                        "tokens": _TOKENS,
                        "shape": _array(_INTEGER),
                        "embedding": {
                            "description": "nested lists of numbers in `shape`, or base64 of float32",
                            "oneOf": [{"type": "array"}, _STRING],
                        },
                    },
                )
            ),
        },
    ),
    "ScoreRequest": _object(["sentences"], {"sentences": _SENTENCES, "model": _MODEL, "per_token": _BOOLEAN}),
    "ScoreResponse": _object(
        ["model", "results"],
        {
            "model": _STRING,
            "results": _array(
                _object(
                    ["sentence", "tokens", "oov"],
                    {
                        "sentence": _TOKENS,
                        "tokens": _INTEGER,
                        "oov": _INTEGER,
                        "forward_logprobs": _array(_NUMBER),
                        "backward_logprobs": _array(_NUMBER),
                    },
                    additionalProperties={"type": ["number", "array"]},
                )
            ),
        },
    ),
    "SubstitutesRequest": _object(
        ["sentence", "position"],
        {
            "sentence": {"oneOf": [_STRING, _TOKENS]},
            "position": {"type": "integer", "minimum": 0},
            "k": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 10},
            "model": _MODEL,
        },
    ),
    "SubstitutesResponse": _object(
        ["model", "tokens", "position", "word", "forward", "backward", "both"],
        {
            "model": _STRING,
            "tokens": _TOKENS,
            "position": _INTEGER,
            "word": _STRING,
            "in_vocabulary": _BOOLEAN,
            **{
                side: _array(_object(["word", "probability"], {"word": _STRING, "probability": _NUMBER}))
                for side in ("forward", "backward", "both")
            },
        },
    ),
    "TokenizeRequest": _object(["input"], {"input": _SENTENCES, "model": _MODEL, "truncate": _TRUNCATE}),
    "TokenizeResponse": _object(
        ["model", "tokens", "count"],
        {"model": _STRING, "tokens": _array(_TOKENS), "count": _array(_INTEGER)},
    ),
    "ModelList": _object(
        ["object", "data"],
        {
            "object": {"const": "list"},
            "data": _array(
                _object(
                    ["id", "object", "created", "owned_by", "dim", "layers", "softmax"],
                    {
                        "id": _STRING,
                        "object": {"const": "model"},
                        "created": _INTEGER,
                        "owned_by": _STRING,
                        "dim": _INTEGER,
                        "layers": _INTEGER,
                        "softmax": _BOOLEAN,
                    },
                )
            ),
        },
    ),
    "Info": _object(
        ["version", "models", "limits", "max_batch_tokens", "max_wait_ms", "tokenize", "truncate"],
        {
            "version": _STRING,
            "models": _array(
                _object(
                    ["id", "dimensions", "layers", "softmax"],
                    {"id": _STRING, "dimensions": _INTEGER, "layers": _INTEGER, "softmax": _BOOLEAN},
                )
            ),
            "limits": {"type": "object", "additionalProperties": _NUMBER},
            "max_batch_tokens": _INTEGER,
            "max_wait_ms": _NUMBER,
            "tokenize": _BOOLEAN,
            "truncate": _BOOLEAN,
        },
    ),
}


def _operation(
    summary: str, ok: dict[str, Any], request: str | None = None, timed: bool = False
) -> dict[str, Any]:
    ok = {**ok, "headers": _TIMING if timed else {"x-request-id": _TIMING["x-request-id"]}}
    operation: dict[str, Any] = {
        "summary": summary,
        "responses": {"200": ok, "default": _json(_ref("Error"), "a refusal: the JSON error")},
    }
    if request is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(request)}},
        }
    return operation


_OK = "the answer"


def _post(summary: str, name: str, timed: bool = True) -> dict[str, Any]:
    """A POST of the schema ``name``Request answered by ``name``Response."""
    return {"post": _operation(summary, _json(_ref(name + "Response"), _OK), name + "Request", timed=timed)}


def _get(summary: str, answer: dict[str, Any]) -> dict[str, Any]:
    """A GET answered by the JSON ``answer``."""
    return {"get": _operation(summary, _json(answer, _OK))}


def schema() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the app's endpoints."""
    paths = {
        "/v1/embeddings": _post("one unit-length vector per input (OpenAI's embeddings API)", "Embeddings"),
        "/embed": _post("token-level vectors", "Embed"),
        "/score": _post("log-probability and perplexity per sentence (models with a softmax)", "Score"),
        "/substitutes": _post(
            "the words the language model predicts at a position (models with a softmax)", "Substitutes"
        ),
        "/tokenize": _post("the tokens each input becomes", "Tokenize", timed=False),
        "/v1/models": _get("the models served", _ref("ModelList")),
        "/info": _get("the version, the models and the limits", _ref("Info")),
        "/health": _get(
            "the process is up (no API key needed)",
            {"type": "object", "properties": {"status": {"const": "ok"}}},
        ),
        "/ready": _get(
            "the models are loaded (503 while stopping)",
            _object(["status", "models"], {"status": {"const": "ready"}, "models": _TOKENS}),
        ),
        "/metrics": {
            "get": _operation(
                "Prometheus text",
                {"description": _OK, "content": {"text/plain": {"schema": _STRING}}},
            )
        },
        "/openapi.json": _get("this document", {"type": "object"}),
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "elmokit serve",
            "version": __version__,
            "description": "ELMo over HTTP: OpenAI-compatible embeddings, token-level vectors, sentence "
            "scores and word predictions. Every refusal is a JSON error; with an API key, every "
            "path but /health needs 'Authorization: Bearer KEY'.",
        },
        "paths": paths,
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


if __name__ == "__main__":
    sys.stdout.write(json.dumps(schema(), indent=2) + "\n")
