from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).parent / "fixtures"

# Whether libhdf5 writes a file again byte for byte: before 2.0 (h5py < 3.16, as make test-lowest
# installs) it stamps the root group's times, so the same content written a second later differs
# in those bytes; the locked h5py 3.16 bundles libhdf5 2.0.
HDF5_BYTES_REPEAT = tuple(int(n) for n in __import__("h5py").version.hdf5_version.split(".")[:2]) >= (2, 0)
TINY = FIXTURES / "elmo-tiny"

# One thread per core among pytest-xdist's workers: two workers of two threads each on two cores
# spin against each other (OpenMP waits busily), which tripled the slowest tests' times. The
# commands the tests start inherit the same share through OMP_NUM_THREADS.
_THREADS = max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
torch.set_num_threads(_THREADS)
os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))

# The quick tier (`make test-fast`, pytest -m "not slow") leaves these modules to the whole suite:
# they run every page of the docs twice, start several processes or torchrun, export and run ONNX
# graphs, compile models, or load every published model shape; together about three quarters
# of the suite's time on two cores. A single slow test elsewhere takes @pytest.mark.slow.
SLOW_MODULES = frozenset(
    {
        "test_docs",
        "test_multiprocess_embed",
        "test_onnx_export",
        "test_seqvec",
        "test_crash",
        "test_pretrained",
        "test_compile",
        "test_script_help",
        "test_flair",
        "test_shards_processes",
        "test_ray",
        "test_spark",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks the tests of ``SLOW_MODULES`` slow."""
    for item in items:
        if item.path.stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _no_network_and_a_private_cache(monkeypatch, tmp_path_factory):
    """No test downloads from the internet or touches the user's download cache: ELMOKIT_OFFLINE
    is set and ELMOKIT_CACHE is a folder of the test session (subprocesses inherit both). The
    download tests unset ELMOKIT_OFFLINE and serve their files from 127.0.0.1."""
    monkeypatch.setenv("ELMOKIT_OFFLINE", "1")
    monkeypatch.setenv("ELMOKIT_CACHE", str(tmp_path_factory.getbasetemp() / "elmokit-cache"))


class LocalServer(http.server.ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 (a free port) standing in for a publisher, the Hugging Face
    Hub or a data set's site; each test module gives its own handler."""

    daemon_threads = True

    def __init__(self, handler) -> None:
        super().__init__(("127.0.0.1", 0), handler)

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"


@contextmanager
def running(server: http.server.HTTPServer) -> Iterator:
    """``server`` answering on a thread of its own, shut down and closed at the end."""
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture()
def network_allowed(monkeypatch, tmp_path) -> Path:
    """Downloads allowed (the tests' servers are on 127.0.0.1) into a private cache, returned."""
    monkeypatch.delenv("ELMOKIT_OFFLINE", raising=False)
    monkeypatch.setenv("ELMOKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def tiny_files() -> tuple[Path, Path]:
    """options.json and weights of the tiny reference model that bilm-tf's tests use."""
    return TINY / "options.json", TINY / "lm_weights.hdf5"


@pytest.fixture(scope="session")
def tiny_sentences() -> list[list[str]]:
    """3 lists of 10 whitespace-tokenized sentences."""
    return json.loads((TINY / "sentences.json").read_text())


@pytest.fixture(scope="session")
def tiny_options() -> dict:
    return json.loads((TINY / "options.json").read_text())
