"""The known-model table and the resolver's forms that need no network: names, folders as the
publishers lay them out, ELMoForManyLangs folders, errors that say what a folder holds."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import json
import shutil
import tarfile
import urllib.parse

import pytest
import torch

from elmokit import BiLM, resolve_model
from elmokit.cli import main
from elmokit.compat.allennlp import DEFAULT_OPTIONS_FILE, DEFAULT_WEIGHT_FILE
from elmokit.hub import model_files, registry
from elmokit.hub.entries import OfflineError, cache_key, entry_dir, is_url
from elmokit.hub.registry import KNOWN_MODELS, find
from elmokit.lm.language_model import LanguageModel
from elmokit.lm.softmax import Softmax
from elmokit.lm.vocabulary import Vocabulary
from elmokit.model.weights import load_softmax, save_softmax

from ..conftest import TINY, LocalServer, running


def test_every_entry_has_urls_a_source_and_a_unique_name():
    names = [n for m in KNOWN_MODELS for n in (m.name, *m.aliases)]
    assert len(names) == len(set(names))
    for model in KNOWN_MODELS:
        assert model.source and model.publisher and model.language and model.description
        assert all(is_url(f.url) for f in model.files)
        roles = sorted(f.role for f in model.files)
        assert roles in (["archive"], ["options", "weights"]), model.name
        assert model.format in ("bilm", "manylangs")


def test_the_publishers_are_all_there():
    by_publisher = {}
    for model in KNOWN_MODELS:
        by_publisher.setdefault(model.publisher.split(" ")[0], []).append(model.name)
    assert {"elmo-small", "elmo-medium", "elmo-original", "elmo-original-5.5b"} <= set(
        by_publisher["AllenNLP"]
    )
    assert {"nlpl-209", "nlpl-210", "nlpl-195"} <= set(by_publisher["NLPL"])
    manylangs = [m for m in KNOWN_MODELS if m.format == "manylangs" and m.name != "efml-zhs"]
    assert len(manylangs) == 44 and len({m.language for m in manylangs}) == 44
    assert sorted(int(m.url.rsplit("/", 1)[1].removesuffix(".zip")) for m in manylangs) == list(
        range(136, 180)
    )
    assert find("efml-nn").url == "http://vectors.nlpl.eu/repository/11/166.zip"
    assert find("seqvec").file("weights").url.endswith("/embedding_models/seqvec/weights.hdf5")


def test_allennlp_original_shares_its_cache_entries_with_the_compat_layers_default():
    """AllenNLP 0.9 writes https://allennlp.s3.amazonaws.com/..., its website s3-us-west-2: one
    S3 object, one cache entry."""
    original = find("elmo-original")
    assert original.file("options").url != DEFAULT_OPTIONS_FILE
    assert entry_dir(original.file("options").url) == entry_dir(DEFAULT_OPTIONS_FILE)
    assert entry_dir(original.file("weights").url) == entry_dir(DEFAULT_WEIGHT_FILE)
    assert cache_key(DEFAULT_WEIGHT_FILE) == (
        "s3://allennlp/models/elmo/2x4096_512_2048cnn_2xhighway/elmo_2x4096_512_2048cnn_2xhighway_weights.hdf5"
    )
    assert entry_dir("s3://allennlp/models/elmo/x.json") == entry_dir(
        "https://allennlp.s3.us-west-2.amazonaws.com/models/elmo/x.json"
    )


def test_names_and_aliases_are_found_in_any_case():
    assert find("ELMo-Small") is find("small") is find("elmo-small")
    assert find("norelmo30").name == "nlpl-217" and find("nlpl-144").name == "efml-en"
    assert find("no-such-model") is None


def test_a_known_model_offline_names_the_download(monkeypatch):
    with pytest.raises(OfflineError) as err:
        resolve_model("elmo-small")
    assert "run `elmokit download elmo-small` on a machine with a network" in str(err.value)


def test_folders_as_publishers_name_their_files(tmp_path):
    expected = BiLM.from_pretrained(TINY).state_dict()
    for weights in (
        "weights.hdf5",
        "model.hdf5",
        "lm_weights.hdf5",
        "elmo_2x1024_128_2048cnn_1xhighway_weights.hdf5",
    ):
        folder = tmp_path / weights
        folder.mkdir()
        options = (
            "options.json"
            if weights != "elmo_2x1024_128_2048cnn_1xhighway_weights.hdf5"
            else "elmo_options.json"
        )
        shutil.copy(TINY / "options.json", folder / options)
        shutil.copy(TINY / "lm_weights.hdf5", folder / weights)
        assert model_files(folder) == (folder / options, folder / weights)
        got = BiLM.from_pretrained(folder).state_dict()
        assert all((got[k] == v).all() for k, v in expected.items())


def test_folder_errors_say_what_the_folder_holds(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    with pytest.raises(
        FileNotFoundError, match=rf"^model folder {folder} has no options.json \(it is empty\)$"
    ):
        resolve_model(folder)
    shutil.copy(TINY / "options.json", folder / "options.json")
    (folder / "README.md").write_text("x")
    with pytest.raises(FileNotFoundError) as err:
        resolve_model(folder)
    assert str(err.value) == (
        f"model folder {folder} has no weights.hdf5, model.hdf5 or lm_weights.hdf5 (it holds: README.md, options.json)"
    )
    shutil.copy(TINY / "lm_weights.hdf5", folder / "weights.hdf5")
    shutil.copy(TINY / "lm_weights.hdf5", folder / "model.hdf5")
    with pytest.raises(ValueError, match=r"has several weight files \(weights.hdf5, model.hdf5\)"):
        resolve_model(folder)
    with pytest.raises(FileNotFoundError, match="^no model folder, archive or known model 'nothing-here'"):
        resolve_model("nothing-here")
    with pytest.raises(ValueError, match="is a file, not a model folder or .zip archive"):
        resolve_model(folder / "options.json")


def test_options_and_weights_pair_and_shipped_names():
    source = resolve_model(TINY / "options.json", TINY / "lm_weights.hdf5")
    assert (source.origin, source.kind, source.folder) == ("files", "bilm", None)
    shipped = resolve_model("elmo-tiny-reference")
    assert (shipped.origin, shipped.name, shipped.weight_file.name) == (
        "shipped",
        "elmo-tiny-reference",
        "weights.hdf5",
    )
    with pytest.raises(FileNotFoundError, match="^weight file not found: "):
        resolve_model(TINY / "options.json", TINY / "nope.hdf5")


def _manylangs_installed() -> bool:
    try:
        import elmokit.model.manylangs  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


def test_an_elmoformanylangs_folder_is_recognised_and_dispatched(tmp_path):
    folder = tmp_path / "en.model"
    folder.mkdir()
    for name in ("config.json", "char.dic", "word.dic", "encoder.pkl", "token_embedder.pkl"):
        (folder / name).write_bytes(b"{}")
    source = resolve_model(tmp_path)  # the single folder inside is looked into, as in a zip
    assert (source.kind, source.folder, source.options_file) == ("manylangs", folder, None)
    with pytest.raises(ValueError, match="is an ELMoForManyLangs model"):
        model_files(folder)
    if not _manylangs_installed():
        with pytest.raises(ValueError, match="^ELMoForManyLangs models are not supported yet$"):
            BiLM.from_pretrained(folder)


def test_an_elmoformanylangs_zip_loads(tmp_path):
    """NLPL's ELMoForManyLangs archives hold the model's folder."""
    fixture = TINY.parent / "elmoformanylangs" / "char-model"
    if not _manylangs_installed() or not fixture.is_dir():
        pytest.skip("needs elmokit.model.manylangs and its test fixture")
    import zipfile

    archive = tmp_path / "144.zip"
    with zipfile.ZipFile(archive, "w") as z:  # the model's folder, and the configs it names (../configs/)
        for path in sorted(fixture.iterdir()):
            z.write(path, f"en.model/{path.name}")
        for path in sorted((fixture.parent / "configs").iterdir()):
            z.write(path, f"configs/{path.name}")
    source = resolve_model(archive)
    assert source.kind == "manylangs" and source.folder.name == "en.model"
    assert BiLM.from_pretrained(archive).num_layers == BiLM.from_pretrained(fixture).num_layers


def test_a_lemmatized_model_is_named_once_when_resolved(monkeypatch, caplog):
    """NLPL 196, 199, 212 (RusVectores lemmas) and 210 (NorELMo, lemmatized) were trained on
    lemmas: resolving one says so, once per process, before anything is downloaded."""
    import elmokit.hub.resolve as resolve

    monkeypatch.setattr(resolve, "_WARNED", set())
    assert {m.name for m in KNOWN_MODELS if m.lemmatized} == {"nlpl-196", "nlpl-199", "nlpl-210", "nlpl-212"}
    assert find("nlpl-199").archive.url == "http://vectors.nlpl.eu/repository/20/199.zip"
    for _ in range(2):
        with caplog.at_level("WARNING", logger="elmokit"), pytest.raises(OfflineError):
            resolve_model("nlpl-199")
    warned = [r.getMessage() for r in caplog.records if "lemmatized" in r.getMessage()]
    assert warned == [
        "nlpl-199 was trained on lemmatized text: give it lemmas (from a lemmatizer such as UDPipe or "
        "Stanza), not raw words, or its vectors are poor"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="elmokit"), pytest.raises(OfflineError):
        resolve_model("nlpl-211")  # NorELMo on tokens
    assert not [r for r in caplog.records if "lemmatized" in r.getMessage()]


# -- the models of issue 46, each resolved from a 127.0.0.1 server standing in for its publisher --
NEW_MODELS = ("efml-zhs", "elmo-de-tsystems", "embeddia-sl")


class _Publisher(LocalServer):
    """Serves ``files`` (path -> bytes) and records the paths asked for."""

    def __init__(self, files: dict[str, bytes]) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                srv: _Publisher = self.server  # type: ignore[assignment]
                srv.asked.append(self.path)
                data = srv.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        super().__init__(Handler)
        self.files = files
        self.asked: list[str] = []


def _tar(members: dict[str, bytes], mode: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture()
def publisher(network_allowed, tmp_path, monkeypatch):
    """The new models' files as their publishers lay them out (made from the tiny fixtures),
    served from 127.0.0.1; the registry's entries point there, with the stand-ins' md5 sums where
    the publisher states one. Yields (server, the served 5.5B softmax, its vocabulary)."""
    options, weights = (TINY / "options.json").read_bytes(), (TINY / "lm_weights.hdf5").read_bytes()
    manylangs = TINY.parent / "elmoformanylangs"
    zhs = {f"zhs.model/{p.name}": p.read_bytes() for p in sorted((manylangs / "char-model").iterdir())}
    zhs |= {f"configs/{p.name}": p.read_bytes() for p in sorted((manylangs / "configs").iterdir())}
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", "the", "cat", "sat", "on", "mat", "."])
    vocab.save(tmp_path / "vocab.txt")
    softmax = Softmax(len(vocab), json.loads(options)["lstm"]["projection_dim"])
    with torch.no_grad():
        softmax.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(0))
    save_softmax(softmax, tmp_path / "softmax.hdf5")
    content = {
        "efml-zhs": {"archive": _tar(zhs, "w:bz2")},
        "elmo-de-tsystems": {"options": options, "weights": weights},
        "embeddia-sl": {
            "archive": _tar(
                {"slovenian/options.json": options, "slovenian/slovenian-elmo-weights.hdf5": weights}, "w:gz"
            )
        },
        "elmo-original-5.5b": {
            "options": options,
            "weights": weights,
            "softmax": (tmp_path / "softmax.hdf5").read_bytes(),
            "vocab": (tmp_path / "vocab.txt").read_bytes(),
        },
    }
    server = _Publisher({})

    def local(model: registry.KnownModel, file: registry.RemoteFile) -> registry.RemoteFile:
        data = content[model.name][file.role]
        path = urllib.parse.urlsplit(file.url).path
        server.files[path] = data
        md5 = hashlib.md5(data).hexdigest() if file.md5 else None
        return dataclasses.replace(file, url=server.url(path), md5=md5)

    served = tuple(
        dataclasses.replace(
            m,
            files=tuple(local(m, f) for f in m.files),
            lm_files=tuple(local(m, f) for f in m.lm_files),
        )
        if m.name in content
        else m
        for m in KNOWN_MODELS
    )
    monkeypatch.setattr(registry, "KNOWN_MODELS", served)
    with running(server):
        yield server, softmax, vocab


def test_the_new_models_are_listed_with_their_sources_and_licences(capsys):
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(NEW_MODELS) <= set(rows)
    assert rows["efml-zhs"]["url"] == "http://39.96.43.154/zhs.model.tar.bz2"
    assert rows["efml-zhs"]["format"] == "manylangs" and rows["efml-zhs"]["licence"] is None
    assert rows["elmo-de-tsystems"]["licence"] == "BSD-2-Clause"
    assert [f["md5"] for f in rows["elmo-de-tsystems"]["files"]] == [
        "da99676f2fe2838ff2663a6d9bad97dd",
        "f3ab3a68caae6d42bac47c230b3a65bf",
    ]
    assert rows["embeddia-sl"]["url"] == (
        "https://www.clarin.si/repository/xmlui/bitstream/handle/11356/1277/slovenian-elmo.tar.gz"
    )
    big = rows["elmo-original-5.5b"]
    assert [(f["role"], f["url"].rsplit("/", 2)[1:]) for f in big["lm_files"]] == [
        (
            "softmax",
            [
                "2x4096_512_2048cnn_2xhighway_5.5B",
                "elmo_2x4096_512_2048cnn_2xhighway_5.5B_softmax_weights.hdf5",
            ],
        ),
        ("vocab", ["tf_checkpoint", "vocab-enwiki-news-500000.txt"]),
    ]
    assert all(not r["lm_files"] for name, r in rows.items() if name != "elmo-original-5.5b")
    assert main(["models"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    assert set(NEW_MODELS) <= listed
    assert find("zhs") is find("efml-zhs") and find("german-elmo").name == "elmo-de-tsystems"


def test_each_new_model_resolves_from_its_publisher(publisher):
    server, _, _ = publisher
    tiny = BiLM.from_pretrained(TINY).state_dict()
    for name, weights in (
        ("elmo-de-tsystems", "weights.hdf5"),
        ("embeddia-sl", "slovenian-elmo-weights.hdf5"),
    ):
        source = resolve_model(name)
        assert (source.origin, source.kind, source.name, source.weight_file.name) == (
            "registry",
            "bilm",
            name,
            weights,
        )
        got = BiLM.from_pretrained(name).state_dict()
        assert all(torch.equal(got[k], v) for k, v in tiny.items())
    assert resolve_model("embeddia-sl").folder.name == "slovenian"
    zhs = resolve_model("zhs")
    assert (zhs.kind, zhs.folder.name) == ("manylangs", "zhs.model")
    if _manylangs_installed():
        fixture = TINY.parent / "elmoformanylangs" / "char-model"
        assert BiLM.from_pretrained("efml-zhs").num_layers == BiLM.from_pretrained(fixture).num_layers
    # each file asked for once (then cached); 2 of T-Systems, 1 archive of CLARIN.SI, 1 of HIT-SCIR
    assert len(server.asked) == len(set(server.asked)) == 4 and not [p for p in server.asked if "5.5B" in p]


def test_a_publishers_md5_that_does_not_match_is_refused(publisher, monkeypatch):
    from elmokit.hub.entries import ChecksumError

    server, _, _ = publisher
    german = find("elmo-de-tsystems")
    wrong = dataclasses.replace(german.files[0], md5="da99676f2fe2838ff2663a6d9bad97dd")
    monkeypatch.setattr(
        registry,
        "KNOWN_MODELS",
        tuple(
            dataclasses.replace(m, files=(wrong, m.files[1])) if m is german else m
            for m in registry.KNOWN_MODELS
        ),
    )
    with pytest.raises(ChecksumError, match="md5"):
        resolve_model("elmo-de-tsystems")


def test_the_5_5b_softmax_is_fetched_for_score_and_substitutes_only(publisher, tmp_path, capsys):
    server, softmax, vocab = publisher
    known = find("5.5b")
    paths = [urllib.parse.urlsplit(f.url).path for f in (*known.files, *known.lm_files)]
    source = resolve_model("5.5b")  # embedding needs the biLM only
    assert source.extras == {} and server.asked == paths[:2]
    model = LanguageModel.from_pretrained("elmo-original-5.5b", device="cpu")
    assert model.vocab.tokens == vocab.tokens
    assert torch.equal(model.softmax.weight, softmax.weight) and torch.equal(model.softmax.bias, softmax.bias)
    assert server.asked == paths
    fetched = LanguageModel.from_pretrained("5.5b", device="cpu").bilm.source_files
    assert {p.name for p in fetched} >= {
        "elmo_2x4096_512_2048cnn_2xhighway_5.5B_softmax_weights.hdf5",
        "vocab-enwiki-news-500000.txt",
    }
    sentences = tmp_path / "in.txt"
    sentences.write_text("the cat sat on the mat .\n", encoding="utf-8")
    assert main(["score", str(sentences), "--model", "5.5b", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == 7
    assert (
        main(["substitutes", "the cat sat", "--word", "1", "-k", "2", "--model", "5.5b", "--device", "cpu"])
        == 0
    )
    assert capsys.readouterr().out.splitlines()[0] == "the [cat] sat"


def test_download_fetches_the_5_5b_softmax_and_vocabulary_too(publisher, capsys):
    server, softmax, _ = publisher
    assert main(["download", "elmo-original-5.5b", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" -> ")[0] for line in lines] == [
        "elmo-original-5.5b options",
        "elmo-original-5.5b weights",
        "elmo-original-5.5b softmax",
        "elmo-original-5.5b vocab",
    ]
    known = find("5.5b")
    assert server.asked == [urllib.parse.urlsplit(f.url).path for f in (*known.files, *known.lm_files)]
    copy = Softmax(*softmax.weight.shape)
    load_softmax(copy, lines[2].split(" -> ")[1])
    assert torch.equal(copy.weight, softmax.weight)
