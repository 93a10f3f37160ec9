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


_TOKENS = {"type": "array", "items": {"type": "string"}}
_SENTENCES = {
    "description": "one text, or a list of texts and token lists",
    "oneOf": [
        {"type": "string"},
        {"type": "array", "items": {"oneOf": [{"type": "string"}, _TOKENS]}},
    ],
}
_MODEL = {"type": "string", "description": "a model's name (GET /v1/models); default: the first served"}
_TRUNCATE = {
    "type": "boolean",
    "description": "cut a sentence to --max-input-tokens tokens and a token to --max-token-chars "
    "characters instead of a 413 (default: the server's --truncate)",
}
_ENCODING = {"type": "string", "enum": ["float", "base64"], "default": "float"}
_TIMING = {
    "x-request-id": {"description": "the request's id", "schema": {"type": "string"}},
    "x-queue-time": {"description": "milliseconds queued before the model ran", "schema": {"type": "string"}},
    "x-inference-time": {"description": "milliseconds of the model's batch", "schema": {"type": "string"}},
}

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": "integer"},
                    "request_id": {"type": "string"},
                },
            }
        },
    },
    "EmbeddingsRequest": {
        "type": "object",
        "required": ["input"],
        "properties": {
            "input": _SENTENCES,
            "model": _MODEL,
            "encoding_format": _ENCODING,
            "layers": {"type": "string", "enum": ["average", "top"], "default": "average"},
            "dimensions": {"type": "integer", "description": "only the model's size"},
            "normalize": {"type": "boolean", "default": True, "description": "unit-length vectors"},
            "truncate": _TRUNCATE,
        },
    },
    "EmbeddingsResponse": {
        "type": "object",
        "required": ["object", "data", "model", "usage"],
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["object", "index", "embedding"],
                    "properties": {
                        "object": {"const": "embedding"},
                        "index": {"type": "integer"},
                        "embedding": {
                            "oneOf": [
                                {"type": "array", "items": {"type": "number"}},
                                {"type": "string", "description": "base64 of little-endian float32"},
                            ]
                        },
                    },
                },
            },
            "model": {"type": "string"},
            "usage": {
                "type": "object",
                "required": ["prompt_tokens", "total_tokens"],
                "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}},
            },
        },
    },
    "EmbedRequest": {
        "type": "object",
        "required": ["sentences"],
        "properties": {
            "sentences": _SENTENCES,
            "model": _MODEL,
            "layers": {"type": "string", "enum": ["all", "top", "average"], "default": "all"},
            "encoding_format": _ENCODING,
            "truncate": _TRUNCATE,
        },
    },
    "EmbedResponse": {
        "type": "object",
        "required": ["model", "layers", "results"],
        "properties": {
            "model": {"type": "string"},
            "layers": {"type": "string"},
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["tokens", "shape", "embedding"],
                    "properties": {
                        "tokens": _TOKENS,
                        "shape": {"type": "array", "items": {"type": "integer"}},
                        "embedding": {
                            "description": "nested lists of numbers in `shape`, or base64 of float32",
                            "oneOf": [{"type": "array"}, {"type": "string"}],
                        },
                    },
                },
            },
        },
    },
    "ScoreRequest": {
        "type": "object",
        "required": ["sentences"],
        "properties": {"sentences": _SENTENCES, "model": _MODEL, "per_token": {"type": "boolean"}},
    },
    "ScoreResponse": {
        "type": "object",
        "required": ["model", "results"],
        "properties": {
            "model": {"type": "string"},
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["sentence", "tokens", "oov"],
                    "properties": {
                        "sentence": _TOKENS,
                        "tokens": {"type": "integer"},
                        "oov": {"type": "integer"},
                        "forward_logprobs": {"type": "array", "items": {"type": "number"}},
                        "backward_logprobs": {"type": "array", "items": {"type": "number"}},
                    },
                    "additionalProperties": {"type": ["number", "array"]},
                },
            },
        },
    },
    "SubstitutesRequest": {
        "type": "object",
        "required": ["sentence", "position"],
        "properties": {
            "sentence": {"oneOf": [{"type": "string"}, _TOKENS]},
            "position": {"type": "integer", "minimum": 0},
            "k": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 10},
            "model": _MODEL,
        },
    },
    "SubstitutesResponse": {
        "type": "object",
        "required": ["model", "tokens", "position", "word", "forward", "backward", "both"],
        "properties": {
            "model": {"type": "string"},
            "tokens": _TOKENS,
            "position": {"type": "integer"},
            "word": {"type": "string"},
            "in_vocabulary": {"type": "boolean"},
            **{
                side: {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["word", "probability"],
                        "properties": {"word": {"type": "string"}, "probability": {"type": "number"}},
                    },
                }
                for side in ("forward", "backward", "both")
            },
        },
    },
    "TokenizeRequest": {
        "type": "object",
        "required": ["input"],
        "properties": {"input": _SENTENCES, "model": _MODEL, "truncate": _TRUNCATE},
    },
    "TokenizeResponse": {
        "type": "object",
        "required": ["model", "tokens", "count"],
        "properties": {
            "model": {"type": "string"},
            "tokens": {"type": "array", "items": _TOKENS},
            "count": {"type": "array", "items": {"type": "integer"}},
        },
    },
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "object", "created", "owned_by", "dim", "layers", "softmax"],
                    "properties": {
                        "id": {"type": "string"},
                        "object": {"const": "model"},
                        "created": {"type": "integer"},
                        "owned_by": {"type": "string"},
                        "dim": {"type": "integer"},
                        "layers": {"type": "integer"},
                        "softmax": {"type": "boolean"},
                    },
                },
            },
        },
    },
    "Info": {
        "type": "object",
        "required": [
            "version",
            "models",
            "limits",
            "max_batch_tokens",
            "max_wait_ms",
            "tokenize",
            "truncate",
        ],
        "properties": {
            "version": {"type": "string"},
            "models": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "dimensions", "layers", "softmax"],
                    "properties": {
                        "id": {"type": "string"},
                        "dimensions": {"type": "integer"},
                        "layers": {"type": "integer"},
                        "softmax": {"type": "boolean"},
                    },
                },
            },
            "limits": {"type": "object", "additionalProperties": {"type": "number"}},
            "max_batch_tokens": {"type": "integer"},
            "max_wait_ms": {"type": "number"},
            "tokenize": {"type": "boolean"},
            "truncate": {"type": "boolean"},
        },
    },
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


def schema() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the app's endpoints."""
    ok = "the answer"
    paths = {
        "/v1/embeddings": {
            "post": _operation(
                "one unit-length vector per input (OpenAI's embeddings API)",
                _json(_ref("EmbeddingsResponse"), ok),
                "EmbeddingsRequest",
                timed=True,
            )
        },
        "/embed": {
            "post": _operation(
                "token-level vectors", _json(_ref("EmbedResponse"), ok), "EmbedRequest", timed=True
            )
        },
        "/score": {
            "post": _operation(
                "log-probability and perplexity per sentence (models with a softmax)",
                _json(_ref("ScoreResponse"), ok),
                "ScoreRequest",
                timed=True,
            )
        },
        "/substitutes": {
            "post": _operation(
                "the words the language model predicts at a position (models with a softmax)",
                _json(_ref("SubstitutesResponse"), ok),
                "SubstitutesRequest",
                timed=True,
            )
        },
        "/tokenize": {
            "post": _operation(
                "the tokens each input becomes", _json(_ref("TokenizeResponse"), ok), "TokenizeRequest"
            )
        },
        "/v1/models": {"get": _operation("the models served", _json(_ref("ModelList"), ok))},
        "/info": {"get": _operation("the version, the models and the limits", _json(_ref("Info"), ok))},
        "/health": {
            "get": _operation(
                "the process is up (no API key needed)",
                _json({"type": "object", "properties": {"status": {"const": "ok"}}}, ok),
            )
        },
        "/ready": {
            "get": _operation(
                "the models are loaded (503 while stopping)",
                _json(
                    {
                        "type": "object",
                        "required": ["status", "models"],
                        "properties": {"status": {"const": "ready"}, "models": _TOKENS},
                    },
                    ok,
                ),
            )
        },
        "/metrics": {
            "get": _operation(
                "Prometheus text",
                {"description": ok, "content": {"text/plain": {"schema": {"type": "string"}}}},
            )
        },
        "/openapi.json": {"get": _operation("this document", _json({"type": "object"}, ok))},
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
