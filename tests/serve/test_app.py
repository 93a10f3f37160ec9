"""`elmokit serve` against real clients and hostile ones: the numbers of the Embedder, batching
that changes nothing, overload, size limits, bad input, the API key, requests that name paths or
URLs, SIGTERM drain and clients that leave. Servers listen on 127.0.0.1 only, started here."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import json
import os
import re
import signal
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

from elmokit.cli import main  # noqa: E402
from elmokit.embed.embedder import Embedder  # noqa: E402
from elmokit.hub.shipped import MODELS_DIR, NEWS_MODEL, TINY_REFERENCE  # noqa: E402
from elmokit.lm.language_model import LanguageModel  # noqa: E402
from elmokit.serve import ServeConfig, create_app  # noqa: E402
from elmokit.serve.config import Limits, ServedModel, load_model, model_name  # noqa: E402

SENTENCES = [
    "The cat sat on the mat .",
    "Hello world",
    "a",
    "She went to the bank to withdraw money , then walked home along the river bank .",
    "Colorless green ideas sleep furiously .",
]
ROOT = Path(__file__).resolve().parents[2]


# -- fixtures and helpers -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny() -> ServedModel:
    return load_model(TINY_REFERENCE, "cpu", 4096)


@pytest.fixture(scope="module")
def reference() -> Embedder:
    """The Embedder a user would run, warm mode, each sentence alone."""
    return Embedder(TINY_REFERENCE, device="cpu")


def _config(**limits) -> ServeConfig:
    max_wait = limits.pop("max_wait_ms", 5.0)
    return ServeConfig(models=(TINY_REFERENCE,), device="cpu", max_wait_ms=max_wait, limits=Limits(**limits))


@contextlib.contextmanager
def running(app):
    """``app`` served by uvicorn on a free 127.0.0.1 port in a thread; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
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


class Gated(ServedModel):
    """A served model whose worker waits for ``gate`` before each batch; records the batches."""

    def __init__(self, base: ServedModel) -> None:
        super().__init__(base.name, base.embedder, base.language_model)
        self.gate, self.entered = threading.Event(), threading.Event()
        self.calls: list[list[list[str]]] = []

    def embed(self, sentences):
        self.calls.append(sentences)
        self.entered.set()
        assert self.gate.wait(20)
        return super().embed(sentences)


def _metric(text: str, name: str, **labels) -> float:
    """A sample's value in Prometheus text (0 when absent)."""
    shown = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name + (f"{{{shown}}}" if labels else "")) + r" (\S+)"
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


def _pooled(array: np.ndarray) -> np.ndarray:
    """/v1/embeddings's vector from the Embedder's (layers, tokens, dim): the mean over tokens
    of the layers' average, scaled to length 1."""
    mean = array.astype(np.float64).mean(axis=0).mean(axis=0)
    return mean / np.linalg.norm(mean)


def _error(response) -> str:
    """The message of a JSON error; fails on anything else (a traceback, HTML, plain text)."""
    assert response.headers["content-type"].startswith("application/json"), response.text
    assert "Traceback" not in response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == response.status_code
    return body["error"]["message"]


# -- real clients: the Embedder's numbers ------------------------------------------------------
def test_openai_client_and_httpx_get_the_embedders_vectors(tiny, reference):
    openai = pytest.importorskip("openai")
    with running(create_app([tiny], _config())) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for encoding in ("base64", "float"):  # the client asks for base64 unless told
            kwargs = {} if encoding == "base64" else {"encoding_format": "float"}
            result = client.embeddings.create(model=TINY_REFERENCE, input=SENTENCES, **kwargs)
            assert [d.index for d in result.data] == list(range(len(SENTENCES)))
            assert result.usage.prompt_tokens == sum(len(s.split()) for s in SENTENCES)
            for text, item in zip(SENTENCES, result.data):
                expected = _pooled(reference.embed_sentence(text.split()))
                np.testing.assert_allclose(np.asarray(item.embedding), expected, atol=1e-5)
        one = client.embeddings.create(model=TINY_REFERENCE, input="Hello world", encoding_format="float")
        np.testing.assert_allclose(
            one.data[0].embedding, _pooled(reference.embed_sentence(["Hello", "world"])), atol=1e-5
        )
        assert [m.id for m in client.models.list().data] == [TINY_REFERENCE]

        tokens = [["New", "York", "is", "big"], ["x"]]
        for layers in ("all", "top", "average"):
            response = httpx.post(f"{url}/embed", json={"sentences": tokens, "layers": layers}, timeout=30)
            assert response.status_code == 200, response.text
            for sentence, result in zip(tokens, response.json()["results"]):
                array = reference.embed_sentence(sentence)
                expected = {"all": array, "top": array[-1], "average": array.mean(axis=0)}[layers]
                assert result["tokens"] == sentence and result["shape"] == list(expected.shape)
                np.testing.assert_allclose(np.asarray(result["embedding"]), expected, atol=1e-5)
        packed = httpx.post(f"{url}/embed", json={"sentences": ["a b c"], "encoding_format": "base64"}).json()
        vector = np.frombuffer(base64.b64decode(packed["results"][0]["embedding"]), "<f4")
        np.testing.assert_allclose(
            vector.reshape(packed["results"][0]["shape"]),
            reference.embed_sentence(["a", "b", "c"]),
            atol=1e-5,
        )


def test_concurrent_requests_get_what_each_gets_alone(tiny, reference):
    """50 requests that arrive while the worker is busy go into one batch (60 sentences of
    different lengths from different requests), and each answer equals its sentences embedded
    alone."""
    texts = [" ".join(SENTENCES[i % len(SENTENCES)].split()[: 1 + i % 9]) + f" w{i}" for i in range(40)]
    gated = Gated(tiny)
    app = create_app([gated], _config(max_wait_ms=0))

    async def drive(url: str) -> tuple[list[dict], str]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            first = asyncio.ensure_future(client.post("/v1/embeddings", json={"input": "held"}))
            while not gated.entered.is_set():
                await asyncio.sleep(0.01)
            calls = [
                client.post("/v1/embeddings", json={"input": [t], "encoding_format": "float"}) for t in texts
            ]
            calls += [client.post("/embed", json={"sentences": [t, "a b"]}) for t in texts[:10]]
            pending = [asyncio.ensure_future(c) for c in calls]
            while (
                _metric((await client.get("/metrics")).text, "elmokit_queue_depth", model=TINY_REFERENCE) < 50
            ):
                await asyncio.sleep(0.01)
            gated.gate.set()
            responses = [await first, *[await p for p in pending]]
            assert all(r.status_code == 200 for r in responses), [
                r.text for r in responses if r.status_code != 200
            ]
            metrics = (await client.get("/metrics")).text
            return [r.json() for r in responses[1:]], metrics

    with running(app) as url:
        bodies, metrics = asyncio.run(drive(url))
    assert [len(call) for call in gated.calls] == [1, 60]
    for text, body in zip(texts, bodies):
        np.testing.assert_allclose(
            body["data"][0]["embedding"], _pooled(reference.embed_sentence(text.split())), atol=1e-5
        )
    for text, body in zip(texts, bodies[len(texts) :]):
        for sentence, result in zip([text.split(), ["a", "b"]], body["results"]):
            np.testing.assert_allclose(
                np.asarray(result["embedding"]), reference.embed_sentence(sentence), atol=1e-5
            )
    assert _metric(metrics, "elmokit_batch_sentences_count", model=TINY_REFERENCE) == 2
    assert _metric(metrics, "elmokit_batch_sentences_sum", model=TINY_REFERENCE) == 61


def test_requests_that_come_together_are_batched_without_help(tiny, reference):
    """No gate: 30 requests sent at once with --max-wait-ms 200 share batches, with the numbers
    each gets alone."""
    texts = [f"sentence number {i} " + "word " * (i % 7) for i in range(30)]

    async def drive(url: str) -> tuple[list, str]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            calls = [
                client.post("/v1/embeddings", json={"input": t, "encoding_format": "float"}) for t in texts
            ]
            responses = await asyncio.gather(*calls)
            return responses, (await client.get("/metrics")).text

    with running(create_app([tiny], _config(max_wait_ms=200))) as url:
        responses, metrics = asyncio.run(drive(url))
    for text, response in zip(texts, responses):
        assert response.status_code == 200
        np.testing.assert_allclose(
            response.json()["data"][0]["embedding"],
            _pooled(reference.embed_sentence(text.split())),
            atol=1e-5,
        )
    assert _metric(metrics, "elmokit_batch_sentences_count", model=TINY_REFERENCE) < 30


# -- load ----------------------------------------------------------------------------------------
def test_a_full_queue_is_503_with_retry_after_and_the_queued_are_answered(tiny):
    gated = Gated(tiny)
    app = create_app([gated], _config(max_queue=2, max_wait_ms=0))

    async def drive(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            first = asyncio.ensure_future(client.post("/v1/embeddings", json={"input": "one"}))
            while not gated.entered.is_set():  # the worker holds "one"; the queue is empty
                await asyncio.sleep(0.01)
            queued = [
                asyncio.ensure_future(client.post("/v1/embeddings", json={"input": w}))
                for w in ("two", "three")
            ]
            while (
                _metric((await client.get("/metrics")).text, "elmokit_queue_depth", model=TINY_REFERENCE) < 2
            ):
                await asyncio.sleep(0.01)
            refused = await client.post("/v1/embeddings", json={"input": "four"})
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            assert "busy" in _error(refused) and "2 requests are waiting" in _error(refused)
            gated.gate.set()
            answers = [await first, *[await q for q in queued]]
            assert [r.status_code for r in answers] == [200, 200, 200]
            again = await client.post("/v1/embeddings", json={"input": "five"})
            assert again.status_code == 200

    with running(app) as url:
        asyncio.run(drive(url))
    assert ["four"] not in [s for call in gated.calls for s in call]


# -- size limits ---------------------------------------------------------------------------------
def test_size_limits_are_413_and_the_server_goes_on(tiny):
    app = create_app(
        [tiny],
        _config(
            max_body_bytes=4000,
            max_inputs=4,
            max_input_tokens=20,
            max_request_tokens=30,
            max_response_values=960,
        ),
    )
    with TestClient(app) as client:
        cases = [
            ({"input": "x " * 2500}, "larger than 4,000 bytes"),
            ({"input": ["a"] * 5}, "'input' has 5 sentences; this server takes at most 4"),
            ({"input": ["a " * 21]}, "input[0] has 21 tokens; this server takes at most 20 per sentence"),
            ({"input": ["a " * 20, "b " * 11]}, "31 tokens in all; this server takes at most 30 per request"),
            ({"input": [["t"] * 21]}, "input[0] has 21 tokens"),
            (
                {"input": ["short " + "x" * 101]},
                "input[0], token 1 has 101 characters; this server takes tokens of at most 100",
            ),
            ({"input": [["a", "é" * 101]]}, "input[0], token 1 has 101 characters"),
        ]
        for body, message in cases:
            response = client.post("/v1/embeddings", json=body)
            assert response.status_code == 413, response.text
            assert message in _error(response)
        # /embed's answer: 11 tokens x 3 layers x 32 = 1,056 numbers > 960; the top layer's 352 fit
        big = client.post("/embed", json={"sentences": ["a " * 11]})
        assert big.status_code == 413 and "would hold 1,056 numbers" in _error(big)
        assert client.post("/embed", json={"sentences": ["a " * 11], "layers": "top"}).status_code == 200
        chunked = client.post("/embed", content=(b"{}" for _ in range(3000)))  # no Content-Length
        assert chunked.status_code == 413 and "larger than 4,000 bytes" in _error(chunked)
        assert client.post("/v1/embeddings", json={"input": ["a " * 20, "b " * 10]}).status_code == 200
        assert client.post("/v1/embeddings", json={"input": "x" * 100}).status_code == 200


# -- bad input -----------------------------------------------------------------------------------
BAD = [
    ("/v1/embeddings", b'{"input": ', "not valid JSON"),
    ("/v1/embeddings", b"", "body is empty"),
    ("/v1/embeddings", b'{"input": "caf\xe9"}', "not UTF-8 (byte 14 is 0xe9)"),
    ("/v1/embeddings", b'["input"]', "must be a JSON object, got an array"),
    ("/v1/embeddings", b'{"model": "elmo-tiny-reference"}', "'input' is required"),
    ("/v1/embeddings", b'{"input": 5}', "'input' must be a string or a list of sentences, got a number"),
    ("/v1/embeddings", b'{"input": [1, 2, 3]}', "list of token ids"),
    ("/v1/embeddings", b'{"input": [[1, 2]]}', "input[0] is a list of token ids"),
    (
        "/v1/embeddings",
        b'{"input": ["ok", null]}',
        "input[1] must be a string or a list of token strings, got null",
    ),
    ("/v1/embeddings", b'{"input": ""}', "input[0] is empty"),
    ("/v1/embeddings", b'{"input": " \\t "}', "input[0] is empty"),
    ("/v1/embeddings", b'{"input": []}', "'input' is empty"),
    ("/v1/embeddings", b'{"input": [["a", ""]]}', "input[0][1] is an empty token"),
    ("/v1/embeddings", b'{"input": [["a", 7]]}', "input[0][1] must be a token string, got a number"),
    ("/v1/embeddings", b'{"input": "a \\ud800 b"}', "unpaired surrogate"),
    (
        "/v1/embeddings",
        b'{"input": "a", "encoding_format": "hex"}',
        "'encoding_format' must be one of float, base64",
    ),
    ("/v1/embeddings", b'{"input": "a", "layers": "all"}', "'layers' must be one of average, top"),
    ("/v1/embeddings", b'{"input": "a", "model": 5}', "'model' must be a string, got a number"),
    ("/v1/embeddings", b'{"input": "a", "dimensions": 8}', "'dimensions' must be 32"),
    ("/v1/embeddings", b"[" * 200_000 + b"]" * 200_000, "not valid JSON"),
    ("/v1/embeddings", b'{"input": "a", "dimensions": ' + b"7" * 5000 + b"}", "not valid JSON"),
    ("/embed", b'{"sentences": "a", "layers": 3}', "'layers' must be one of all, top, average, got a number"),
    ("/embed", b'{"sentences": {"a": 1}}', "got an object"),
    ("/score", b'{"sentences": ["a"]}', "has no softmax"),
    ("/substitutes", b'{"sentence": "a b"}', "has no softmax"),
]


@pytest.mark.parametrize(
    ("path", "body", "message"), BAD, ids=[f"{i}-{m[:24]}" for i, (_, _, m) in enumerate(BAD)]
)
def test_bad_input_is_a_4xx_json_error_naming_the_problem(tiny, reference, path, body, message):
    with TestClient(create_app([tiny], _config())) as client:  # a server exception would raise here
        response = client.post(path, content=body, headers={"content-type": "application/json"})
        assert 400 <= response.status_code < 500, response.text
        assert message in _error(response)
        good = client.post("/v1/embeddings", json={"input": "the server goes on", "encoding_format": "float"})
        assert good.status_code == 200
        np.testing.assert_allclose(
            good.json()["data"][0]["embedding"],
            _pooled(reference.embed_sentence("the server goes on".split())),
            atol=1e-5,
        )


def test_unknown_paths_and_methods_are_json_errors(tiny):
    with TestClient(create_app([tiny], _config())) as client:
        assert client.get("/nope").status_code == 404 and "Not Found" in _error(client.get("/nope"))
        wrong = client.get("/v1/embeddings")
        assert wrong.status_code == 405 and "Method Not Allowed" in _error(wrong)
        for hidden in ("/docs", "/redoc"):  # no interactive docs; the schema is served (/openapi.json)
            assert client.get(hidden).status_code == 404


# -- security ------------------------------------------------------------------------------------
def test_api_key_is_required_on_every_endpoint_but_health(tiny):
    openai = pytest.importorskip("openai")
    app = create_app([tiny], _config(), api_key="s3cret")
    calls = [
        ("POST", "/v1/embeddings", {"input": "a"}),
        ("POST", "/embed", {"sentences": ["a"]}),
        ("POST", "/score", {"sentences": ["a"]}),
        ("POST", "/substitutes", {"sentence": "a", "position": 0}),
        ("GET", "/v1/models", None),
        ("GET", "/ready", None),
        ("GET", "/metrics", None),
        ("GET", "/nope", None),
    ]
    with running(app) as url, httpx.Client(base_url=url) as client:
        assert client.get("/health").status_code == 200
        for method, path, body in calls:
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": "s3cret"},
                {"Authorization": "Basic s3cret"},
            ):
                refused = client.request(method, path, json=body, headers=headers)
                assert refused.status_code == 401, (path, headers)
                assert refused.headers["www-authenticate"] == "Bearer"
                assert "API key" in _error(refused)
        good = {"Authorization": "Bearer s3cret"}
        assert client.post("/v1/embeddings", json={"input": "a"}, headers=good).status_code == 200
        assert client.get("/metrics", headers=good).status_code == 200
        assert client.get("/v1/models", headers={"authorization": "bearer s3cret"}).status_code == 200
        assert (
            client.post("/score", json={"sentences": ["a"]}, headers=good).status_code == 400
        )  # past the key
        assert (
            openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret")
            .embeddings.create(model=TINY_REFERENCE, input="a")
            .data
        )
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="nope", max_retries=0).embeddings.create(
                model=TINY_REFERENCE, input="a"
            )


class _Recorder(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802
        self.hits.append(self.path)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_a_request_can_only_name_models_loaded_at_start(tiny, monkeypatch, tmp_path):
    """Paths, URLs and names of models that exist but were not loaded are 404: the server reads
    no file and fetches no URL for a request."""
    import elmokit.hub.resolve
    import elmokit.lm.language_model
    import elmokit.model.bilm

    def forbidden(*args, **kwargs):
        raise AssertionError(f"a request made the server load a model: {args}")

    recorder = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    here = f"http://127.0.0.1:{recorder.server_address[1]}"
    (tmp_path / "secret.txt").write_text("the-file-contents")
    names = [
        str(MODELS_DIR / TINY_REFERENCE),
        str(MODELS_DIR / NEWS_MODEL),
        NEWS_MODEL,
        "elmo-small",
        f"{here}/model.zip",
        f"file://{tmp_path}/secret.txt",
        "../elmo-tiny-reference",
        str(tmp_path / "secret.txt"),
        "x" * 5000,
    ]
    try:
        with TestClient(create_app([tiny], _config())) as client:
            for module in (elmokit.hub.resolve, elmokit.model.bilm, elmokit.lm.language_model):
                monkeypatch.setattr(module, "resolve_model", forbidden)
            for name in names:
                for path, body in (
                    ("/v1/embeddings", {"input": "a"}),
                    ("/embed", {"sentences": ["a"]}),
                    ("/score", {"sentences": ["a"]}),
                ):
                    response = client.post(path, json={**body, "model": name})
                    assert response.status_code == 404, (name, response.text)
                    message = _error(response)
                    assert "is not served here; served: elmo-tiny-reference" in message and len(message) < 200
                    assert "the-file-contents" not in response.text
    finally:
        recorder.shutdown()
    assert _Recorder.hits == []


def test_model_names_from_specs():
    assert model_name("elmo-news-512") == ("elmo-news-512", "elmo-news-512")
    assert model_name("/models/my-elmo/") == ("my-elmo", "/models/my-elmo/")
    assert model_name("https://host/a/elmo.zip") == ("elmo", "https://host/a/elmo.zip")
    assert model_name("news=/models/x") == ("news", "/models/x")
    with pytest.raises(ValueError, match="cannot name it from its path; give NAME="):
        model_name("https://h/x?a=b.zip")


# -- clients that leave --------------------------------------------------------------------------
def test_a_client_that_disconnects_while_queued_costs_nothing_further(tiny):
    gated = Gated(tiny)
    app = create_app([gated], _config(max_wait_ms=0))

    async def drive(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            first = asyncio.ensure_future(client.post("/v1/embeddings", json={"input": "held"}))
            while not gated.entered.is_set():
                await asyncio.sleep(0.01)
            leaving = httpx.AsyncClient(base_url=url, timeout=30)
            request = asyncio.ensure_future(
                leaving.post("/v1/embeddings", json={"input": "left before its turn"})
            )
            while (
                _metric((await client.get("/metrics")).text, "elmokit_queue_depth", model=TINY_REFERENCE) < 1
            ):
                await asyncio.sleep(0.01)
            request.cancel()  # the client gives up: its connection closes
            with contextlib.suppress(asyncio.CancelledError):
                await request
            await leaving.aclose()
            deadline = time.monotonic() + 10
            while (
                _metric((await client.get("/metrics")).text, "elmokit_cancelled_total", model=TINY_REFERENCE)
                < 1
            ):
                assert time.monotonic() < deadline, "the server did not notice the client leave"
                await asyncio.sleep(0.02)
            metrics = (await client.get("/metrics")).text
            assert _metric(metrics, "elmokit_queue_depth", model=TINY_REFERENCE) == 0
            gated.gate.set()
            assert (await first).status_code == 200
            assert (await client.post("/v1/embeddings", json={"input": "after"})).status_code == 200

    with running(app) as url:
        asyncio.run(drive(url))
    computed = [" ".join(s) for call in gated.calls for s in call]
    assert computed == ["held", "after"]


# -- the language model --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def news() -> ServedModel:
    return load_model(NEWS_MODEL, "cpu", 4096)


def test_score_substitutes_and_vectors_of_a_model_with_a_softmax(news):
    from elmokit.lm.scoring import score_sentences, substitutes

    lm = LanguageModel.from_pretrained(NEWS_MODEL, device="cpu")
    sentences = [s.split() for s in SENTENCES[:3]]
    config = ServeConfig(models=(NEWS_MODEL,), device="cpu")
    with TestClient(create_app([news], config)) as client:
        scored = client.post(
            "/score", json={"sentences": [" ".join(s) for s in sentences], "per_token": True}
        )
        assert scored.status_code == 200, scored.text
        for expected, got in zip(score_sentences(lm, sentences), scored.json()["results"]):
            assert got["sentence"] == expected.tokens and got["tokens"] == len(expected.tokens)
            assert got["logprob"] == pytest.approx(expected.logprob, abs=1e-4)
            assert got["perplexity"] == pytest.approx(expected.perplexity, rel=1e-4)
            assert len(got["forward_logprobs"]) == len(expected.tokens) + 1
        tokens = "She went to the bank to withdraw money .".split()
        found = client.post("/substitutes", json={"sentence": tokens, "position": 4, "k": 5})
        assert found.status_code == 200, found.text
        expected = substitutes(lm, tokens, 4, k=5).to_dict()
        assert [w["word"] for w in found.json()["both"]] == [w["word"] for w in expected["both"]]
        assert found.json()["probability"]["both"] == pytest.approx(expected["probability"]["both"], abs=1e-6)
        outside = client.post("/substitutes", json={"sentence": tokens, "position": 9})
        assert outside.status_code == 400 and "'position' must be between 0 and 8, got 9" in _error(outside)
        kind = client.post("/substitutes", json={"sentence": tokens, "position": "4"})
        assert kind.status_code == 400 and "'position' must be an integer, got a string" in _error(kind)
        vectors = client.post(
            "/v1/embeddings", json={"input": SENTENCES[0], "encoding_format": "float"}
        ).json()
    embedder = Embedder(NEWS_MODEL, device="cpu")  # loaded on its own, as a user would
    np.testing.assert_allclose(
        vectors["data"][0]["embedding"], _pooled(embedder.embed_sentence(sentences[0])), atol=1e-5
    )


# -- the command ---------------------------------------------------------------------------------
def _env(**extra) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", **extra)
    return env


def _start(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, str, list[str]]:
    """`elmokit serve ARGS --port 0` as a subprocess; (process, base URL, its stderr lines so far)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "elmokit.cli", "serve", *args, "--port", "0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line)
        if "Application startup complete" in line:
            url = next(re.search(r"http://127\.0\.0\.1:\d+", x).group(0) for x in lines if "serving" in x)
            threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True).start()
            return process, url, lines
    process.kill()
    raise AssertionError("the server did not start:\n" + "".join(lines))


def test_sigterm_answers_requests_in_flight_and_exits_0(reference):
    process, url, lines = _start(
        ["--model", TINY_REFERENCE, "--max-wait-ms", "1500", "--threads", "1"], _env(ELMOKIT_API_KEY="k3y")
    )
    try:
        key = {"Authorization": "Bearer k3y"}
        assert httpx.get(f"{url}/ready").status_code == 401  # the key came from the environment
        answers: list = []
        client = threading.Thread(
            target=lambda: answers.append(
                httpx.post(
                    f"{url}/v1/embeddings",
                    json={"input": "in flight", "encoding_format": "float"},
                    headers=key,
                    timeout=30,
                )
            )
        )
        client.start()
        deadline = time.monotonic() + 20
        while (
            _metric(
                httpx.get(f"{url}/metrics", headers=key).text,
                "elmokit_requests_in_flight",
                endpoint="/v1/embeddings",
            )
            < 1
        ):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        # the request waits in the batcher for company (--max-wait-ms 1500)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(httpx.ConnectError):  # no longer accepting
            httpx.get(f"{url}/health", timeout=2)
        client.join(20)
        assert process.wait(timeout=15) == 0, "".join(lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert len(answers) == 1 and answers[0].status_code == 200, answers
    np.testing.assert_allclose(
        answers[0].json()["data"][0]["embedding"],
        _pooled(reference.embed_sentence(["in", "flight"])),
        atol=1e-5,
    )
    assert "Traceback" not in "".join(lines)


def test_command_errors_are_one_line(capsys, tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        port = str(busy.getsockname()[1])
        assert main(["serve", "--model", TINY_REFERENCE, "--port", port]) == 2
        assert re.fullmatch(
            r"elmokit: error: cannot listen on 127\.0\.0\.1:\d+: .+\n", capsys.readouterr().err
        )
    finally:
        busy.close()
    missing = tmp_path / "no-such-model"
    assert main(["serve", "--model", str(missing), "--port", "0"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert (
        err[-1].startswith("elmokit: error: ")
        and "no-such-model" in err[-1]
        and "Traceback" not in "\n".join(err)
    )
    assert (
        main(["serve", "--model", TINY_REFERENCE, "--model", f"{MODELS_DIR / TINY_REFERENCE}", "--port", "0"])
        == 2
    )
    assert "share the name elmo-tiny-reference; name them with NAME=SPEC" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--max-batch-tokens", "0"])
    assert "at least 1" in capsys.readouterr().err


def test_config_round_trips_for_worker_processes():
    config = ServeConfig(models=("a=x", "y"), max_wait_ms=2.0, limits=Limits(max_queue=7))
    assert ServeConfig.from_json(config.to_json()) == config
    with pytest.raises(ValueError, match="max-queue must be a positive integer"):
        Limits(max_queue=0)
    assert json.loads(config.to_json())["limits"]["max_queue"] == 7


def test_the_models_are_checked_before_the_server_starts(tmp_path):
    """``check_models`` (which ``serve`` calls before it binds its port or starts a worker
    process) refuses a model that does not exist and two with one name, in one line each."""
    from elmokit.serve.config import check_models

    check_models(ServeConfig(models=(TINY_REFERENCE, f"tiny={MODELS_DIR / TINY_REFERENCE}")))
    gone = tmp_path / "gone"
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"no model folder, archive or known model '{gone}'")
    ):
        check_models(ServeConfig(models=(TINY_REFERENCE, f"gone={gone}")))
    with pytest.raises(ValueError, match="^two --model share the name tiny; name them with NAME=SPEC$"):
        check_models(ServeConfig(models=(f"tiny={TINY_REFERENCE}", f"tiny={tmp_path}")))


def test_a_worker_process_reads_its_configuration_and_key_from_the_environment(monkeypatch):
    """What each `--workers` process runs: the models and limits of ELMOKIT_SERVE_CONFIG, the
    key of ELMOKIT_API_KEY (never written into the configuration)."""
    from elmokit.serve.app import create_app_from_env
    from elmokit.serve.config import API_KEY_ENV, CONFIG_ENV

    config = ServeConfig(
        models=(f"tiny={MODELS_DIR / TINY_REFERENCE}",), device="cpu", limits=Limits(max_inputs=2)
    )
    assert "k3y" not in config.to_json()
    monkeypatch.setenv(CONFIG_ENV, config.to_json())
    monkeypatch.setenv(API_KEY_ENV, "k3y")
    with TestClient(create_app_from_env()) as client:
        assert client.get("/v1/models").status_code == 401
        key = {"Authorization": "Bearer k3y"}
        assert [m["id"] for m in client.get("/v1/models", headers=key).json()["data"]] == ["tiny"]
        assert (
            client.post(
                "/v1/embeddings", json={"input": ["a", "b", "c"], "model": "tiny"}, headers=key
            ).status_code
            == 413
        )


def test_several_models_in_one_process_each_answer_for_itself(tiny, reference):
    """Two models served side by side (the second the tiny model with its LSTM weights shifted,
    so its vectors differ): each request gets the model it names, the first by default."""
    import copy

    import torch

    bilm = copy.deepcopy(tiny.embedder.bilm)
    with torch.no_grad():
        for p in bilm.lstm.parameters():
            p.add_(0.01)
    other = ServedModel("other", Embedder(bilm, device="cpu", max_tokens_per_batch=4096))
    expected_other = Embedder(bilm, device="cpu").embed_sentence(["a", "b"])
    with TestClient(create_app([tiny, other], _config())) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [TINY_REFERENCE, "other"]
        answers = {
            name: client.post(
                "/embed", json={"sentences": ["a b"], **({"model": name} if name else {})}
            ).json()
            for name in (None, TINY_REFERENCE, "other")
        }
    assert answers[None]["model"] == TINY_REFERENCE and answers["other"]["model"] == "other"
    np.testing.assert_allclose(
        np.asarray(answers[None]["results"][0]["embedding"]), reference.embed_sentence(["a", "b"]), atol=1e-5
    )
    np.testing.assert_allclose(
        np.asarray(answers["other"]["results"][0]["embedding"]), expected_other, atol=1e-5
    )
    assert np.abs(expected_other - reference.embed_sentence(["a", "b"])).max() > 1e-3


def test_a_client_that_leaves_while_sending_its_body_is_not_an_error(tiny):
    with running(create_app([tiny], _config())) as url:
        port = int(url.rsplit(":", 1)[1])
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port)) as raw:
                raw.sendall(
                    b'POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"input": '
                )
                time.sleep(0.2)
        time.sleep(0.3)
        with httpx.Client(base_url=url) as client:
            assert client.post("/v1/embeddings", json={"input": "still here"}).status_code == 200
            metrics = client.get("/metrics").text
    assert _metric(metrics, "elmokit_requests_total", endpoint="/v1/embeddings", status="500") == 0
    assert _metric(metrics, "elmokit_requests_total", endpoint="/v1/embeddings", status="200") == 1


def test_text_is_split_on_spaces_or_tokenized_as_the_corpus_was(tiny):
    pytest.importorskip("sacremoses")
    for tokenize, expected in ((False, ["Hello,", "world!"]), (True, ["Hello", ",", "world", "!"])):
        config = ServeConfig(models=(TINY_REFERENCE,), device="cpu", tokenize=tokenize)
        with TestClient(create_app([tiny], config)) as client:
            result = client.post("/embed", json={"sentences": ["Hello, world!"], "layers": "top"}).json()
            assert result["results"][0]["tokens"] == expected
            usage = client.post("/v1/embeddings", json={"input": "Hello, world!"}).json()["usage"]
            assert usage["prompt_tokens"] == len(expected)


def test_without_the_serve_extra_the_command_says_what_to_install():
    code = (
        "import sys; sys.modules['starlette'] = None; from elmokit.cli import main; sys.exit(main(['serve']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120
    )
    assert done.returncode == 2
    assert re.fullmatch(
        r"elmokit: error: elmokit serve needs the serve extra \(.*starlette.*\); install it with: "
        r"pip install 'elmokit\[serve\]'\n",
        done.stderr,
    ), done.stderr


class Exploding(Gated):
    """A gated model that fails on any batch holding the token "boom"."""

    def embed(self, sentences):
        if any("boom" in s for s in sentences):
            self.calls.append(sentences)
            raise RuntimeError("the model failed")
        return super().embed(sentences)


def test_a_request_that_breaks_the_model_fails_alone(tiny, reference):
    exploding = Exploding(tiny)
    app = create_app([exploding], _config(max_wait_ms=0))

    async def drive(url: str) -> list:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            first = asyncio.ensure_future(client.post("/v1/embeddings", json={"input": "held"}))
            while not exploding.entered.is_set():
                await asyncio.sleep(0.01)
            texts = ["one fine", "it goes boom", "two fine"]
            pending = [
                asyncio.ensure_future(
                    client.post("/v1/embeddings", json={"input": t, "encoding_format": "float"})
                )
                for t in texts
            ]
            while (
                _metric((await client.get("/metrics")).text, "elmokit_queue_depth", model=TINY_REFERENCE) < 3
            ):
                await asyncio.sleep(0.01)
            exploding.gate.set()
            answers = [await first, *[await p for p in pending]]
            answers.append(await client.post("/v1/embeddings", json={"input": "after"}))
            return answers

    with running(app) as url:
        held, one, boom, two, after = asyncio.run(drive(url))
    assert [r.status_code for r in (held, one, boom, two, after)] == [200, 200, 500, 200, 200]
    assert _error(boom) == "internal error; the server log has its details"
    for text, answer in (("one fine", one), ("two fine", two)):
        np.testing.assert_allclose(
            answer.json()["data"][0]["embedding"], _pooled(reference.embed_sentence(text.split())), atol=1e-5
        )
    assert [len(c) for c in exploding.calls] == [1, 3, 1, 1, 1, 1]  # the batch of 3, then each alone


def test_the_server_says_which_http_stack_it_runs_on(monkeypatch, caplog):
    import importlib.util

    from elmokit.serve import app as serve_app

    for absent, message in [
        ({"uvloop"}, "uvloop not installed: uvicorn runs on asyncio, which"),
        (
            {"uvloop", "httptools"},
            "uvloop and httptools not installed: uvicorn runs on asyncio and h11, which",
        ),
    ]:
        caplog.clear()
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a, absent=absent: None if name in absent else object()
        )
        with caplog.at_level("INFO", logger="elmokit.serve.app"):
            serve_app._log_http_stack()
        [record] = caplog.records
        assert record.levelname == "WARNING"
        assert record.getMessage().startswith(message)
        assert "pip install 'elmokit[serve]'" in record.getMessage()

    caplog.clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    with caplog.at_level("INFO", logger="elmokit.serve.app"):
        serve_app._log_http_stack()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("INFO", "HTTP: uvloop and httptools")]


def test_a_model_is_loaded_and_run_on_one_thread_of_its_own(monkeypatch):
    """torch's OpenMP threads are a team per calling thread: the warm-up at load and every batch
    run on the model's one thread, never the event loop's or the caller's."""
    seen: list[int] = []
    original = ServedModel.embed

    def recording(self, sentences):
        seen.append(threading.get_ident())
        return original(self, sentences)

    monkeypatch.setattr(ServedModel, "embed", recording)
    model = load_model(TINY_REFERENCE, "cpu", 4096)
    with TestClient(create_app([model], _config())) as client:
        for _ in range(2):
            assert client.post("/v1/embeddings", json={"input": "a b"}).status_code == 200
    runner = model.runner.submit(threading.get_ident).result()
    assert seen == [runner] * 3 and runner != threading.get_ident()


def test_verbose_reaches_every_worker_process(monkeypatch, tmp_path):
    """`elmokit -v serve --workers N`: each worker process shows the library's INFO lines too."""
    import elmokit.serve

    factories: list[str] = []
    monkeypatch.setattr(
        elmokit.serve, "serve", lambda *a, worker_factory, **k: factories.append(worker_factory)
    )
    assert main(["-v", "serve", "--workers", "2", "--model", "m=x"]) == 0
    assert main(["serve", "--workers", "2", "--model", "m=x"]) == 0
    config = ServeConfig(models=(f"tiny={MODELS_DIR / TINY_REFERENCE}",), device="cpu")
    shown = []
    for factory in factories:  # what uvicorn does in each worker process
        code = (
            "import logging, uvicorn.importer\n"
            f"uvicorn.importer.import_from_string({factory!r})()\n"
            "logging.getLogger('elmokit.embed.embedder').info('an INFO line of the library')\n"
        )
        env = {**_env(), "ELMOKIT_SERVE_CONFIG": config.to_json()}
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True
        )
        shown.append("an INFO line of the library" in done.stderr.splitlines())
    assert shown == [True, False]
