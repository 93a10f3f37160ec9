"""The known-model table and the resolver's forms that need no network: names, folders as the
publishers lay them out, ELMoForManyLangs folders, errors that say what a folder holds."""

from __future__ import annotations

import shutil

import pytest

from elmokit import BiLM, resolve_model
from elmokit.compat.allennlp import DEFAULT_OPTIONS_FILE, DEFAULT_WEIGHT_FILE
from elmokit.hub import model_files
from elmokit.hub.entries import OfflineError, cache_key, entry_dir, is_url
from elmokit.hub.registry import KNOWN_MODELS, find

from .conftest import TINY


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
    manylangs = [m for m in KNOWN_MODELS if m.format == "manylangs"]
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
