"""elmokit.hub, the one way to get a model: every spec form through one resolver, Hugging Face Hub
repositories through huggingface_hub against a stand-in Hub on 127.0.0.1, one cache folder, and
the entry points built on it (BiLM/LanguageModel.from_pretrained, Elmo, Embedder)."""

from __future__ import annotations

import hashlib
import http.server
import json
import shutil
import sys
import zipfile

import pytest
import torch

from elmokit import DEFAULT_MODEL, BiLM, Elmo, Embedder, LanguageModel, StatefulBiLM, batch_to_ids
from elmokit.cli import main
from elmokit.hub import DownloadError, cache_dir, resolve_model
from elmokit.hub.hf import parse_hf_spec
from elmokit.hub.shipped import MODELS_DIR, TINY_REFERENCE, refuse_package_path
from elmokit.hub.transport import OfflineError
from elmokit.model.inputs import InputScheme
from elmokit.model.manylangs import ManyLangsInputs
from elmokit.tasks.cache import default_cache_dir

from ..conftest import FIXTURES, LocalServer, running

TINY_FOLDER = MODELS_DIR / TINY_REFERENCE
MANYLANGS = FIXTURES / "elmoformanylangs" / "char-model"
REPO = "allenai/elmo-tiny"
COMMITS = {"main": "a" * 40, "v1": "b" * 40}  # the stand-in Hub's revisions -> commits


# -- a stand-in for the Hugging Face Hub ---------------------------------------------------------
class _Hub(LocalServer):
    """What huggingface_hub's snapshot_download asks of a Hub for a small public repository:
    GET /api/models/{repo}/revision/{revision} (the commit and the file list), then per file HEAD
    and GET /{repo}/resolve/{commit}/{file} (X-Repo-Commit, ETag and Content-Length; the bytes)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(_HubHandler)
        self.files = files
        self.requests: list[tuple[str, str]] = []

    @property
    def endpoint(self) -> str:
        return self.url()


def _git_blob_id(data: bytes) -> str:
    """The id git (and so the Hub) gives a file's contents: sha1 of ``blob <size>\\0`` + contents."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _HubHandler(http.server.BaseHTTPRequestHandler):
    server: _Hub

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        hub = self.server
        path = self.path.split("?", 1)[0]
        hub.requests.append((self.command, path))
        api = f"/api/models/{REPO}/revision/"
        resolve = f"/{REPO}/resolve/"
        if path.startswith(api) and path[len(api) :] in COMMITS:
            commit = COMMITS[path[len(api) :]]
            info = {"id": REPO, "sha": commit, "siblings": [{"rfilename": name} for name in hub.files]}
            return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
        tree = f"/api/models/{REPO}/tree/"
        if path.startswith(tree) and path[len(tree) :] in COMMITS.values():
            # huggingface_hub 1.x and 2.x list a snapshot's files here before they download it
            # (0.x reads the revision's "siblings" above): one page, so no Link header.
            listing = [
                {"type": "file", "path": name, "size": len(data), "oid": _git_blob_id(data)}
                for name, data in hub.files.items()
            ]
            return self._send(200, json.dumps(listing).encode(), {"Content-Type": "application/json"}, body)
        if path.startswith(resolve):
            commit, _, name = path[len(resolve) :].partition("/")
            if commit in COMMITS.values() and name in hub.files:
                data = hub.files[name]
                headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
                return self._send(200, data, headers, body)
        self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}, body)

    def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)


@pytest.fixture()
def hub(monkeypatch, network_allowed):
    """The stand-in Hub holding the tiny model (options.json, weights.hdf5) as HF_ENDPOINT, a
    private cache, and the network allowed (127.0.0.1 only)."""
    pytest.importorskip("huggingface_hub")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    files = {name: (TINY_FOLDER / name).read_bytes() for name in ("options.json", "weights.hdf5")}
    with running(_Hub(files)) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server


def _layers(bilm: BiLM) -> torch.Tensor:
    ids = batch_to_ids([["The", "cat", "sat", "."], ["Hello"]])
    with torch.no_grad():
        return bilm(ids).layers


# -- hf:// ----------------------------------------------------------------------------------------
def test_an_hf_repository_is_read_like_its_folder_and_lands_in_the_one_cache(hub, monkeypatch):
    bilm = BiLM.from_pretrained(f"hf://{REPO}")
    assert torch.equal(_layers(bilm), _layers(BiLM.from_pretrained(TINY_REFERENCE)))
    source = resolve_model(f"hf://{REPO}")
    assert source.origin == "hf" and source.kind == "bilm"
    assert source.folder is not None and (cache_dir() / "hf") in source.folder.parents
    assert source.weight_file is not None and source.weight_file.read_bytes() == hub.files["weights.hdf5"]
    assert ("GET", f"/api/models/{REPO}/revision/main") in hub.requests
    assert ("GET", f"/{REPO}/resolve/{COMMITS['main']}/weights.hdf5") in hub.requests
    # offline, the cached snapshot is used and the Hub is not asked
    monkeypatch.setenv("ELMOKIT_OFFLINE", "1")
    asked = len(hub.requests)
    assert resolve_model(f"hf://{REPO}").weight_file == source.weight_file
    assert len(hub.requests) == asked
    # the cache holds publishers' files: no output may go there
    with pytest.raises(ValueError, match="inside elmokit's download cache"):
        refuse_package_path(source.folder / "copy")


def test_an_hf_revision_is_asked_for_and_embedder_and_elmo_take_hf_specs(hub):
    spec = f"hf://{REPO}@v1"
    embedder = Embedder(spec, device="cpu", mode="zero")
    assert ("GET", f"/api/models/{REPO}/revision/v1") in hub.requests
    assert ("GET", f"/{REPO}/resolve/{COMMITS['v1']}/options.json") in hub.requests
    reference = Embedder(TINY_REFERENCE, device="cpu", mode="zero")
    sentence = [["a", "small", "test"]]
    assert (embedder.embed_batch(sentence)[0] == reference.embed_batch(sentence)[0]).all()
    elmo = Elmo(spec, num_output_representations=1, dropout=0.0)
    assert elmo.output_dim == reference.bilm.output_dim


def test_hf_errors_are_one_line(hub, monkeypatch, capsys):
    with pytest.raises(DownloadError, match=r"^cannot download hf://allenai/nothing from the Hugging Face Hub: "):
        resolve_model("hf://allenai/nothing")
    for bad in ("hf://no-owner", "hf://a/b/c", "hf://a/../b", "hf://a/b@"):
        with pytest.raises(ValueError, match=r"expected hf://owner/name\[@revision\]$"):
            parse_hf_spec(bad)
    monkeypatch.setenv("ELMOKIT_OFFLINE", "1")
    asked = len(hub.requests)
    with pytest.raises(OfflineError, match=r"ELMOKIT_OFFLINE=1 forbids downloading it") as err:
        resolve_model(f"hf://{REPO}@v1")
    assert "\n" not in str(err.value)
    assert len(hub.requests) == asked
    assert main(["embed", "-", "out.hdf5", "--model", f"hf://{REPO}", "--quiet"]) == 2
    message = capsys.readouterr().err
    assert message.startswith("elmokit: error: hf://allenai/elmo-tiny is not in the cache") and message.count("\n") == 1


def test_without_huggingface_hub_an_hf_spec_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"^hf://a/b needs huggingface_hub: pip install 'elmokit\[hub\]'$"):
        BiLM.from_pretrained("hf://a/b")
    assert main(["download", "hf://a/b"]) == 2
    assert capsys.readouterr().err == "elmokit: error: hf://a/b needs huggingface_hub: pip install 'elmokit[hub]'\n"


def test_cli_download_of_an_hf_repository(hub, capsys):
    assert main(["download", f"hf://{REPO}", "--quiet"]) == 0
    folder = resolve_model(f"hf://{REPO}").folder
    assert capsys.readouterr().out == f"hf://{REPO} -> {folder}\n"


# -- every form, one resolver ----------------------------------------------------------------------
def test_from_pretrained_of_each_local_form_gives_the_same_model(tmp_path):
    expected = _layers(BiLM.from_pretrained(TINY_REFERENCE))
    folder = tmp_path / "folder"
    shutil.copytree(TINY_FOLDER, folder)
    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as z:  # NLPL's layout: model.hdf5
        z.write(TINY_FOLDER / "options.json", "options.json")
        z.write(TINY_FOLDER / "weights.hdf5", "model.hdf5")
    for spec in (folder, str(folder), archive):
        assert torch.equal(_layers(BiLM.from_pretrained(spec)), expected), spec
    stateful = BiLM.from_pretrained(folder, stateful=True)
    assert isinstance(stateful, StatefulBiLM) and not stateful.training
    assert type(BiLM.from_pretrained(TINY_REFERENCE)) is BiLM
    default = BiLM.from_pretrained()
    assert default.options == BiLM.load(*resolve_model(DEFAULT_MODEL).files()).options
    with pytest.raises(FileNotFoundError, match=r"^no model folder, archive or known model 'no-such-thing'"):
        BiLM.from_pretrained("no-such-thing")


def test_from_pretrained_builds_elmoformanylangs_models_with_their_input_scheme():
    bilm = BiLM.from_pretrained(MANYLANGS)
    assert type(bilm) is BiLM and isinstance(bilm.inputs, ManyLangsInputs)
    assert bilm.boundary_tokens == ("<bos>", "<eos>")
    assert type(BiLM.from_pretrained(TINY_REFERENCE).inputs) is InputScheme
    with pytest.raises(ValueError, match="cannot be written in bilm-tf's layout"):
        bilm.save("options.json", "weights.hdf5")
    assert resolve_model(MANYLANGS).kind == "manylangs"


def test_start_state_refuses_an_elmoformanylangs_model_in_one_line(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("a b c\n", encoding="utf-8")
    assert main(["start-state", str(MANYLANGS), "--text", str(text), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("elmokit: error: ") and "ELMoForManyLangs model" in err and err.count("\n") == 1


def test_start_state_out_copies_a_model_whose_weights_are_not_named_weights_hdf5(tmp_path, capsys):
    folder = tmp_path / "nlpl"
    folder.mkdir()
    shutil.copy(TINY_FOLDER / "options.json", folder / "options.json")
    shutil.copy(TINY_FOLDER / "weights.hdf5", folder / "model.hdf5")
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat .\n" * 20, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["start-state", str(folder), "--text", str(text), "--rows", "2", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == ["model.hdf5", "options.json"]
    assert BiLM.from_pretrained(out).start_state is not None


# -- one cache folder, one default -----------------------------------------------------------------
def test_one_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("ELMOKIT_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    assert default_cache_dir() == tmp_path / "c" / "task-layers"


# -- the entry points built on it ------------------------------------------------------------------
def test_elmo_arguments_after_the_model_are_keyword_only():
    options, weights = resolve_model(TINY_REFERENCE).files()
    with pytest.raises(TypeError):
        Elmo(options, weights, 2, True)  # AllenNLP's order: elmokit.compat.allennlp.Elmo
    with pytest.raises(TypeError):
        Elmo(TINY_REFERENCE, None, 2)


def test_elmo_by_name_equals_elmo_from_its_files():
    options, weights = resolve_model(TINY_REFERENCE).files()
    mix = [0.2, -0.5, 1.0]
    by_name = Elmo(TINY_REFERENCE, num_output_representations=2, dropout=0.0, scalar_mix_parameters=mix)
    by_files = Elmo(options, weights, num_output_representations=2, dropout=0.0, scalar_mix_parameters=mix)
    ids = batch_to_ids([["A", "bank", "."], ["river", "bank"]])
    with torch.no_grad():
        a, b = by_name.eval()(ids), by_files.eval()(ids)
    assert len(a.representations) == 2
    for x, y in zip(a.representations, b.representations):
        assert torch.equal(x, y)
    assert not any(p.requires_grad for p in by_name.bilm.parameters())


def test_language_model_without_a_softmax_is_one_line():
    for spec in (TINY_REFERENCE, MANYLANGS):
        with pytest.raises(FileNotFoundError, match=r"^this model ships no softmax\.hdf5: scoring needs one") as err:
            LanguageModel.from_pretrained(spec)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="no vocabulary"):
        _ = LanguageModel(BiLM.from_pretrained(TINY_REFERENCE).options).vocab


def test_language_model_from_pretrained_reads_the_softmax_beside_the_weights():
    if not (MODELS_DIR / DEFAULT_MODEL / "softmax.hdf5").is_file():
        pytest.skip("the shipped model has no softmax.hdf5")
    model = LanguageModel.from_pretrained(device="cpu")
    assert model.softmax is not None and not model.training
    assert model.softmax.weight.shape[0] == len(model.vocab)
    bilm = BiLM.from_pretrained()
    assert all(torch.equal(a, b) for a, b in zip(model.bilm.state_dict().values(), bilm.state_dict().values()))
