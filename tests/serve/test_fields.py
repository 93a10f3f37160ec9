"""`elmokit serve` as TEI and OpenAI clients expect it, and bounded in what it reads: request heads
past their size, count or time refused before the API key (at the socket, both HTTP parsers),
unit vectors from /v1/embeddings, `dimensions`, /info, /tokenize, truncation, the timing headers,
the request id, and the OpenAPI schema (committed, served, and fuzzed with schemathesis).
Servers listen on 127.0.0.1 only, started here."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from starlette.testclient import TestClient  # noqa: E402

from elmokit.embed import Embedder  # noqa: E402
from elmokit.hub.shipped import TINY_REFERENCE  # noqa: E402
from elmokit.serve import ServeConfig, create_app  # noqa: E402
from elmokit.serve.config import Limits, ServedModel, load_model  # noqa: E402
from elmokit.serve.http import BoundedHttpTools, HeadLimits, protocol  # noqa: E402
from elmokit.serve.openapi import schema  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KEY = {"Authorization": "Bearer k3y"}
PARSERS = ["h11"] + (["httptools"] if BoundedHttpTools is not None else [])


@pytest.fixture(scope="module")
def tiny() -> ServedModel:
    return load_model(TINY_REFERENCE, "cpu", 4096)


@pytest.fixture(scope="module")
def reference() -> Embedder:
    return Embedder(TINY_REFERENCE, device="cpu")


def _config(truncate: bool = False, **limits) -> ServeConfig:
    return ServeConfig(models=(TINY_REFERENCE,), device="cpu", truncate=truncate, limits=Limits(**limits))


def _mean(array: np.ndarray) -> np.ndarray:
    """The Embedder's mean-pooled vector: the mean over tokens of the layers' average."""
    return array.astype(np.float64).mean(axis=0).mean(axis=0)


def _unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


def _message(response) -> str:
    assert response.headers["content-type"].startswith("application/json"), response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == response.status_code
    return body["error"]["message"]


# -- request heads, at the socket -----------------------------------------------------------------
@contextlib.contextmanager
def running(app, http: str, head: HeadLimits):
    """``app`` under uvicorn with the bounded protocol of ``http`` on a free 127.0.0.1 port;
    yields the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="on",
        http=protocol(http, head),
        h11_max_incomplete_event_size=head.max_bytes,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


def _exchange(port: int, data: bytes, timeout: float = 10) -> tuple[int, bytes, float]:
    """Send ``data`` (stopping when the server closes) and read until it closes: (status, body,
    seconds until the answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        start = time.monotonic()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for at in range(0, len(data), 65536):
                conn.sendall(data[at : at + 65536])
        chunks = []
        with contextlib.suppress(ConnectionResetError):
            while chunk := conn.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks) and _complete(b"".join(chunks)):
                    break
        elapsed = time.monotonic() - start
    answer = b"".join(chunks)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), answer[:200]
    return int(head.split()[1]), body, elapsed


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    found = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
    return found is not None and len(body) >= int(found.group(1))


def _request(path: str, headers: bytes = b"", body: bytes = b"", key: bool = True) -> bytes:
    method = b"POST" if body else b"GET"
    auth = b"Authorization: Bearer k3y\r\n" if key else b""
    length = b"Content-Length: %d\r\nContent-Type: application/json\r\n" % len(body) if body else b""
    return b"%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s%s%s\r\n%s" % (
        method,
        path.encode(),
        auth,
        length,
        headers,
        body,
    )


@pytest.mark.parametrize("http", PARSERS)
def test_a_request_head_past_its_size_or_count_is_refused_before_the_api_key(tiny, http):
    app = create_app([tiny], _config(max_header_bytes=4096, max_headers=20), api_key="k3y")
    with running(app, http, HeadLimits(4096, 20, 5.0)) as port:
        # one header of 1 MB, no key: refused once the head passes 4 KiB, before the key check
        status, body, _ = _exchange(
            port, _request("/info", b"X-Big: " + b"a" * (1 << 20) + b"\r\n", key=False)
        )
        assert status == 431, body
        assert json.loads(body)["error"]["message"] == (
            "the request line and headers are larger than 4,096 bytes, the most this server reads"
        )
        # many small headers with the key: refused past 20 (by the parser or the app's guard)
        many = b"".join(b"X-H%d: v\r\n" % i for i in range(30))
        status, body, _ = _exchange(port, _request("/info", many))
        assert status == 431 and b"more than 20 headers" in body, body
        # within the limits: answered, and a body far larger than the head limit is not counted
        fine = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(15))
        status, body, _ = _exchange(port, _request("/info", fine))
        assert status == 200 and json.loads(body)["models"][0]["id"] == TINY_REFERENCE
        text = json.dumps({"input": " ".join(["w" * 60] * 400)}).encode()  # 24 KB in the same send
        status, body, _ = _exchange(port, _request("/tokenize", body=text))
        assert status == 200 and json.loads(body)["count"] == [400], body[:200]
        status, body, _ = _exchange(port, _request("/info", fine, key=False))
        assert status == 401  # the key check is still there behind the limits


@pytest.mark.parametrize("http", PARSERS)
def test_slow_request_headers_are_cut_off(tiny, http):
    """A client that sends its headers a byte at a time gets a 408 at the header timeout; one that
    sends nothing is closed; a keep-alive connection's next request has the same clock."""
    app = create_app([tiny], _config())
    with running(app, http, HeadLimits(32768, 100, 0.6)) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            start = time.monotonic()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                for byte in _request("/info", b"X-Slow: " + b"s" * 100 + b"\r\n"):
                    conn.sendall(bytes([byte]))
                    time.sleep(0.05)
                    if time.monotonic() - start > 5:  # bounded: the server should have cut it long ago
                        break
            answer = conn.recv(65536)
            elapsed = time.monotonic() - start
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"did not arrive within 0.6 s" in answer and elapsed < 2.5
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            start = time.monotonic()
            assert conn.recv(100) == b"" and time.monotonic() - start < 2.5  # nothing sent: closed
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(_request("/health", key=False))
            first = conn.recv(65536)
            assert first.startswith(b"HTTP/1.1 200 "), first
            conn.sendall(b"GET /health HTTP/1.1\r\n")  # the next request's head never ends
            start = time.monotonic()
            second = conn.recv(65536)
        assert second.startswith(b"HTTP/1.1 408 ") and time.monotonic() - start < 2.5, second


def test_the_app_counts_headers_whatever_serves_it(tiny):
    """The app's own check (what the h11 parser does not count, and any other ASGI server):
    past the count or the size, 431 before the API key."""
    app = create_app([tiny], _config(max_headers=30, max_header_bytes=2000), api_key="k3y")
    with TestClient(app) as client:
        many = {f"x-h{i}": "v" for i in range(40)}
        response = client.get("/info", headers=many)  # no key
        assert response.status_code == 431 and "more than 30 headers" in _message(response)
        response = client.get("/info", headers={"x-big": "b" * 3000, **KEY})
        assert response.status_code == 431 and "larger than 2,000 bytes" in _message(response)
        assert client.get("/info", headers={"x-big": "b" * 1000, **KEY}).status_code == 200
        assert client.get("/info").status_code == 401


def test_the_command_takes_the_head_limits(tmp_path):
    from elmokit.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--max-headers", "0"])
    with pytest.raises(ValueError, match="header-timeout"):
        ServeConfig(header_timeout=0)
    config = ServeConfig(
        header_timeout=2.5, truncate=True, limits=Limits(max_header_bytes=9000, max_headers=7)
    )
    assert ServeConfig.from_json(config.to_json()) == config
    with pytest.raises(ValueError, match="auto, httptools or h11"):
        protocol("zttp", HeadLimits(1, 1, 1))
    import pickle  # --workers processes unpickle uvicorn's config, and with it the protocol

    bound = pickle.loads(pickle.dumps(protocol("auto", HeadLimits(10, 2, 1.5))))
    assert bound.keywords == {"head": HeadLimits(10, 2, 1.5)}


# -- vectors as the field expects them ------------------------------------------------------------
def _start(args: list[str]) -> tuple[subprocess.Popen, str, list[str]]:
    """`elmokit serve ARGS --port 0` as a subprocess on 127.0.0.1; (process, base URL, stderr lines)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    process = subprocess.Popen(
        [sys.executable, "-m", "elmokit.cli", "serve", *args, "--port", "0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert process.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line)
        if "Application startup complete" in line:
            url = next(m.group(0) for x in lines if (m := re.search(r"http://127\.0\.0\.1:\d+", x)))
            threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True).start()
            return process, url, lines
    process.kill()
    raise AssertionError("the server did not start:\n" + "".join(lines))


SENTENCES = ["The cat sat on the mat .", "Hello world", "a", "Colorless green ideas sleep furiously ."]


def test_the_openai_client_gets_unit_vectors_with_the_embedders_direction(reference):
    openai = pytest.importorskip("openai")
    process, url, lines = _start(["--model", TINY_REFERENCE, "--threads", "1"])
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for kwargs in ({}, {"encoding_format": "float"}):  # the client asks for base64 unless told
            result = client.embeddings.create(model=TINY_REFERENCE, input=SENTENCES, **kwargs)
            for text, item in zip(SENTENCES, result.data):
                vector = np.asarray(item.embedding, dtype=np.float64)
                expected = _mean(reference.embed_sentence(text.split()))
                assert abs(np.linalg.norm(vector) - 1) < 1e-6
                assert abs(vector @ expected / np.linalg.norm(expected) - 1) < 1e-6  # cosine 1
        raw = client.embeddings.create(
            model=TINY_REFERENCE,
            input="Hello world",
            encoding_format="float",
            extra_body={"normalize": False},
        )
        np.testing.assert_allclose(
            raw.data[0].embedding, _mean(reference.embed_sentence(["Hello", "world"])), atol=1e-5
        )
        with pytest.raises(openai.BadRequestError, match="forward half and a backward half"):
            client.embeddings.create(model=TINY_REFERENCE, input="Hello", dimensions=16)
        same = client.embeddings.create(model=TINY_REFERENCE, input="Hello", dimensions=32)
        assert len(same.data[0].embedding) == 32
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0, "".join(lines)
    assert "Traceback" not in "".join(lines)


def test_embed_stays_raw_and_bad_options_are_named(tiny, reference):
    with TestClient(create_app([tiny], _config())) as client:
        body = client.post("/embed", json={"sentences": ["Hello world"], "layers": "all"}).json()
        np.testing.assert_allclose(
            np.asarray(body["results"][0]["embedding"]),
            reference.embed_sentence(["Hello", "world"]),
            atol=1e-5,
        )
        for options, message in [
            ({"normalize": "yes"}, "'normalize' must be true or false, got a string"),
            ({"dimensions": "32"}, "'dimensions' must be 32, the model's size, got a string"),
            ({"dimensions": True}, "'dimensions' must be 32, the model's size, got a boolean"),
            ({"truncate": 1}, "'truncate' must be true or false, got a number"),
        ]:
            response = client.post("/v1/embeddings", json={"input": "a", **options})
            assert response.status_code == 400 and _message(response).startswith(message), response.text


def test_info_and_tokenize(tiny):
    with TestClient(create_app([tiny], _config(max_input_tokens=50))) as client:
        info = client.get("/info").json()
        from elmokit import __version__

        assert info["version"] == __version__
        assert info["models"] == [{"id": TINY_REFERENCE, "dimensions": 32, "layers": 3, "softmax": False}]
        assert info["limits"]["max_input_tokens"] == 50 and info["limits"]["max_header_bytes"] == 32768
        assert info["truncate"] is False and info["tokenize"] is False
        text = "New  York\tis big ."
        tokens = client.post("/tokenize", json={"input": [text, ["a", "b"]]}).json()
        assert tokens == {
            "model": TINY_REFERENCE,
            "tokens": [["New", "York", "is", "big", "."], ["a", "b"]],
            "count": [5, 2],
        }
        embedded = client.post("/embed", json={"sentences": [text]}).json()["results"][0]["tokens"]
        assert embedded == tokens["tokens"][0]  # the splitter the server embeds with
        response = client.post("/tokenize", json={"input": 3})
        assert response.status_code == 400 and "'input' must be a string" in _message(response)


def test_truncation_is_opt_in_and_gives_the_vectors_of_what_is_kept(tiny, reference):
    long_text = " ".join(f"w{i}" for i in range(80))
    long_token = "x" * 150
    with TestClient(create_app([tiny], _config(max_input_tokens=50))) as client:
        response = client.post("/v1/embeddings", json={"input": long_text})
        assert response.status_code == 413
        assert _message(response) == (
            "input[0] has 80 tokens; this server takes at most 50 per sentence (or send 'truncate': true)"
        )
        response = client.post(
            "/v1/embeddings",
            json={"input": long_text, "truncate": True, "encoding_format": "float", "normalize": False},
        )
        assert response.status_code == 200 and response.json()["usage"]["prompt_tokens"] == 50
        kept = long_text.split()[:50]
        np.testing.assert_allclose(
            response.json()["data"][0]["embedding"], _mean(reference.embed_sentence(kept)), atol=1e-5
        )
        cut = client.post("/tokenize", json={"input": [f"a {long_token}"], "truncate": True}).json()
        assert cut["tokens"] == [["a", "x" * 100]]
        # a token cut to 100 characters has the vectors of the whole one (the CNN reads 48 bytes)
        vectors = client.post("/embed", json={"sentences": [["a", long_token]], "truncate": True}).json()
        np.testing.assert_allclose(
            np.asarray(vectors["results"][0]["embedding"]),
            reference.embed_sentence(["a", long_token]),
            atol=1e-5,
        )
        response = client.post("/score", json={"sentences": [long_text]})
        assert "truncate" not in _message(response)  # /score offers no truncation: no hint
    with TestClient(create_app([tiny], _config(truncate=True, max_input_tokens=50))) as client:
        assert client.get("/info").json()["truncate"] is True
        assert client.post("/tokenize", json={"input": long_text}).json()["count"] == [50]
        response = client.post("/v1/embeddings", json={"input": long_text, "truncate": False})
        assert response.status_code == 413


def test_timing_headers_and_request_ids(tiny, caplog):
    with TestClient(create_app([tiny], _config())) as client:
        response = client.post(
            "/v1/embeddings", json={"input": "Hello world"}, headers={"x-request-id": "abc-123"}
        )
        assert response.status_code == 200 and response.headers["x-request-id"] == "abc-123"
        for name in ("x-queue-time", "x-inference-time"):
            assert float(response.headers[name]) >= 0
        assert float(response.headers["x-inference-time"]) > 0
        info = client.get("/info")
        assert "x-queue-time" not in info.headers and re.fullmatch(
            r"[0-9a-f]{32}", info.headers["x-request-id"]
        )
        for insane in ("has spaces", "x" * 200, "caf\u00e9"):
            given = client.get("/info", headers={"x-request-id": insane.encode("utf-8")})
            assert re.fullmatch(r"[0-9a-f]{32}", given.headers["x-request-id"]), insane
        refused = client.post("/v1/embeddings", json={"input": ""}, headers={"x-request-id": "req-7"})
        assert refused.status_code == 400 and refused.headers["x-request-id"] == "req-7"
        assert refused.json()["error"]["request_id"] == "req-7"
        missing = client.get("/nowhere")
        assert missing.json()["error"]["request_id"] == missing.headers["x-request-id"]


class Broken(ServedModel):
    """A served model whose batches fail with an error the app does not expect (a 500)."""

    def embed(self, sentences):
        raise RuntimeError("the model broke")


def test_an_internal_error_carries_the_request_id_into_the_log(tiny, caplog):
    broken = Broken(tiny.name, tiny.embedder)
    with TestClient(create_app([broken], _config()), raise_server_exceptions=False) as client:
        with caplog.at_level(logging.ERROR, logger="elmokit.serve"):
            response = client.post("/v1/embeddings", json={"input": "a"}, headers={"x-request-id": "boom-1"})
    assert response.status_code == 500 and response.headers["x-request-id"] == "boom-1"
    assert response.json()["error"]["request_id"] == "boom-1"
    assert any("(request boom-1)" in r.getMessage() for r in caplog.records), caplog.text


# -- the OpenAPI schema ---------------------------------------------------------------------------
def test_the_committed_schema_is_the_one_served(tiny):
    committed = json.loads((ROOT / "docs" / "openapi.json").read_text())
    with TestClient(create_app([tiny], _config())) as client:
        served = client.get("/openapi.json").json()
    assert served == schema()
    assert committed == served, (
        "docs/openapi.json is stale: python -m elmokit.serve.openapi > docs/openapi.json"
    )
    from elmokit.serve.app import ENDPOINTS

    assert sorted(served["paths"]) == sorted(ENDPOINTS)
