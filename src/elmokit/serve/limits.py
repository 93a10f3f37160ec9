"""Reading and checking a request within the ``Limits``; every refusal is an ``ApiError``, answered
as one JSON error in OpenAI's layout."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse

from ..base.textfiles import line_splitter
from .config import Limits

__all__: list[str] = []

RETRY = {"Retry-After": "1"}  # sent with every 503
REQUEST_ID: ContextVar[str | None] = ContextVar("elmokit_request_id", default=None)  # set by the app's guard


# -- errors -------------------------------------------------------------------------------------
class ApiError(Exception):
    """A request refused: its HTTP status and the one-line message of its JSON error."""

    KINDS = {
        401: "authentication_error",
        404: "not_found_error",
        413: "request_too_large",
        431: "request_too_large",
        503: "overloaded",
    }

    def __init__(
        self, status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.param, self.headers)


def error_response(
    status: int, message: str, param: str | None = None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The JSON error of every refusal (``error_body``)."""
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The JSON of every refusal, in the OpenAI layout, {"error": {message, type, param, code}},
    with the request's id (``request_id``) when the app's guard has given it one."""
    kind = ApiError.KINDS.get(status, "invalid_request_error" if status < 500 else "server_error")
    error: dict[str, Any] = {"message": message, "type": kind, "param": param, "code": status}
    request_id = REQUEST_ID.get()
    if request_id is not None:
        error["request_id"] = request_id
    return {"error": error}


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


# -- requests -----------------------------------------------------------------------------------
async def read_json(request: Request, limits: Limits) -> dict:
    """The request's body as a JSON object, read up to ``max_body_bytes``."""
    limit = limits.max_body_bytes
    too_large = f"the request body is larger than {limit:,} bytes, the most this server takes"
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, too_large)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, too_large)
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body.strip():
        raise ApiError(400, "the request body is empty: send a JSON object")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ApiError(
            400, f"the request body is not UTF-8 (byte {err.start} is {body[err.start]:#04x})"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ApiError(
            400, f"the request body is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}"
        ) from None
    except RecursionError:
        raise ApiError(400, "the request body is not valid JSON: nested too deeply") from None
    except ValueError as err:  # e.g. an integer of more digits than Python converts
        raise ApiError(400, f"the request body is not valid JSON: {str(err)[:120]}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {kind_of(data)}")
    return data


def kind_of(value: Any) -> str:
    """A JSON value's type, in JSON's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def choice(data: dict, key: str, choices: Sequence[str], default: str) -> str:
    value = data.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str) or value not in choices:
        shown = json.dumps(value)[:40] if isinstance(value, str) else kind_of(value)
        raise ApiError(400, f"'{key}' must be one of {', '.join(choices)}, got {shown}", key)
    return value


def integer(data: dict, key: str, default: int | None, low: int, high: int) -> int:
    value = data.get(key, default)
    if value is None:
        raise ApiError(400, f"'{key}' is required: an integer", key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(400, f"'{key}' must be an integer, got {kind_of(value)}", key)
    if not low <= value <= high:
        raise ApiError(400, f"'{key}' must be between {low} and {high}, got {value}", key)
    return value


def flag(data: dict, key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise ApiError(400, f"'{key}' must be true or false, got {kind_of(value)}", key)
    return value


class Inputs:
    """Turns a request's sentences (strings, split as the server was told, or lists of token
    strings) into checked token lists within the limits. With ``truncate`` true, a sentence of
    more than ``max_input_tokens`` tokens keeps its first ones and a token of more than
    ``max_token_chars`` characters its first characters, instead of a 413; false: the 413 says
    that truncation is offered; None (the default): an endpoint that does not offer it."""

    def __init__(self, limits: Limits, tokenize: bool) -> None:
        self.limits, self.split = limits, line_splitter(tokenize)

    def sentence(self, value: Any, where: str, truncate: bool | None = None) -> list[str]:
        if isinstance(value, str):
            check_text(value, where)
            tokens = self.split(value)
        elif isinstance(value, list):
            if value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
                raise ApiError(
                    400,
                    f"{where} is a list of token ids: ELMo reads characters, so send text or a list "
                    "of token strings",
                    where,
                )
            for j, token in enumerate(value):
                if not isinstance(token, str):
                    raise ApiError(400, f"{where}[{j}] must be a token string, got {kind_of(token)}", where)
                check_text(token, f"{where}[{j}]")
                if not token or token.isspace():
                    raise ApiError(400, f"{where}[{j}] is an empty token", where)
            tokens = list(value)
        else:
            raise ApiError(
                400, f"{where} must be a string or a list of token strings, got {kind_of(value)}", where
            )
        if not tokens:
            raise ApiError(400, f"{where} is empty: it has no tokens", where)
        if truncate:
            chars = self.limits.max_token_chars
            return [t[:chars] for t in tokens[: self.limits.max_input_tokens]]
        hint = " (or send 'truncate': true)" if truncate is False else ""
        if len(tokens) > self.limits.max_input_tokens:
            raise ApiError(
                413,
                f"{where} has {len(tokens):,} tokens; this server takes at most "
                f"{self.limits.max_input_tokens:,} per sentence{hint}",
                where,
            )
        longest = max(range(len(tokens)), key=lambda j: len(tokens[j]))
        if len(tokens[longest]) > self.limits.max_token_chars:
            raise ApiError(
                413,
                f"{where}, token {longest} has {len(tokens[longest]):,} characters; this server takes "
                f"tokens of at most {self.limits.max_token_chars:,}{hint}",
                where,
            )
        return tokens

    def sentences(self, value: Any, key: str, truncate: bool | None = None) -> list[list[str]]:
        """The sentences of ``value``: one string, or a list whose items are strings or lists of
        token strings (a bare list of strings is that many sentences, as OpenAI's ``input``)."""
        if value is None:
            raise ApiError(400, f"'{key}' is required: a string or a list of sentences", key)
        if isinstance(value, str):
            items = [value]
        elif isinstance(value, list):
            if all(isinstance(t, int) and not isinstance(t, bool) for t in value) and value:
                raise ApiError(
                    400,
                    f"'{key}' is a list of token ids: ELMo reads characters, so send text or lists "
                    "of token strings",
                    key,
                )
            items = value
        else:
            raise ApiError(400, f"'{key}' must be a string or a list of sentences, got {kind_of(value)}", key)
        if not items:
            raise ApiError(400, f"'{key}' is empty: give at least one sentence", key)
        if len(items) > self.limits.max_inputs:
            raise ApiError(
                413,
                f"'{key}' has {len(items):,} sentences; this server takes at most {self.limits.max_inputs:,}",
                key,
            )
        out = [self.sentence(item, f"{key}[{i}]", truncate) for i, item in enumerate(items)]
        total = sum(len(s) for s in out)
        if total > self.limits.max_request_tokens:
            raise ApiError(
                413,
                f"'{key}' has {total:,} tokens in all; this server takes at most "
                f"{self.limits.max_request_tokens:,} per request",
                key,
            )
        return out


def check_text(text: str, where: str) -> None:
    """Text a response can carry: UTF-8 encodable (JSON's \\ud800 escapes can make lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(
            400, f"{where} holds an unpaired surrogate (\\ud800-\\udfff): not text", where
        ) from None


def encode(vector: np.ndarray, encoding: str) -> list | str:
    """A float32 array as JSON numbers (nested lists), or base64 of its little-endian bytes."""
    if encoding == "base64":
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector.tolist()
