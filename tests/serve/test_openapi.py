"""`elmokit serve` fuzzed against its own OpenAPI schema with schemathesis: requests generated from
the schema (and, in its negative mode, outside it) to a real server on 127.0.0.1; no answer is a
500, and every answer has a documented status, content type and body."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from elmokit.hub.shipped import TINY_REFERENCE  # noqa: E402
from elmokit.serve import ServeConfig, create_app  # noqa: E402
from elmokit.serve.config import Limits, load_model  # noqa: E402
from elmokit.serve.http import HeadLimits, protocol  # noqa: E402

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """A server with the bounded protocol and small limits (so that generated inputs reach the
    413s too); its base URL."""
    model = load_model(TINY_REFERENCE, "cpu", 4096)
    limits = Limits(max_inputs=8, max_input_tokens=40, max_request_tokens=100, max_token_chars=60)
    app = create_app([model], ServeConfig(models=(TINY_REFERENCE,), device="cpu", limits=limits))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(
        app, log_level="warning", lifespan="on", http=protocol("auto", HeadLimits(32768, 100, 5.0))
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_answer_is_within_the_schema(url, mode):
    """Each operation of the schema the server serves, ``max_examples`` generated requests each
    (negative mode: the operations with a body to break), through schemathesis's strategies under
    hypothesis (its pytest plugin's lazy loading, ``from_fixture``, fails on pytest 9)."""
    api = schemathesis.openapi.from_url(f"{url}/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    assert {"POST /v1/embeddings", "POST /embed", "POST /tokenize", "GET /info"} <= {
        o.label for o in operations
    }
    statuses: dict[str, set[int]] = {}
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and operation.method.upper() == "GET":
            continue  # nothing to break: no parameters, no body

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=20,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=True,  # the same requests every run: a failure is reproducible
        )
        def answers_within_the_schema(case) -> None:
            response = case.call_and_validate(checks=CHECKS, timeout=30)
            statuses.setdefault(case.operation.label, set()).add(response.status_code)

        answers_within_the_schema()
    if mode is GenerationMode.POSITIVE:  # the generated requests reach the model, not only refusals
        reached = [k for k in ("POST /v1/embeddings", "POST /embed", "POST /tokenize") if 200 in statuses[k]]
        assert reached, statuses
    else:
        assert all(code < 500 for codes in statuses.values() for code in codes), statuses
