"""Every compat class and function takes every model spec the hub resolves (a shipped name, a
folder, an NLPL .zip, an http(s) URL of one) where AllenNLP took (options_file, weight_file), with
the numbers of the two files; a model given beside a weight file is a one-line error."""

from __future__ import annotations

import functools
import http.server
import shutil
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from elmokit.cli import main
from elmokit.compat.allennlp import Elmo, ElmoEmbedder, ElmoTokenEmbedder, batch_to_ids
from elmokit.compat.manylangs import ManyLangsEmbedder
from elmokit.compat.simple_elmo import ElmoModel
from elmokit.hub.shipped import MODELS_DIR, TINY_REFERENCE

from ..conftest import FIXTURES, LocalServer, running
from ..hub.test_hub import REPO, hub  # noqa: F401 - the stand-in Hugging Face Hub fixture

TINY_FOLDER = MODELS_DIR / TINY_REFERENCE
OPTIONS, WEIGHTS = TINY_FOLDER / "options.json", TINY_FOLDER / "weights.hdf5"
MANYLANGS = FIXTURES / "elmoformanylangs" / "char-model"
SENTENCES = [["The", "cat", "sat", "."], ["Hello"]]


def _zip(folder: Path, archive: Path, rename: dict[str, str] | None = None) -> Path:
    """``folder``'s files in a .zip (NLPL's layout: renamed as ``rename`` says)."""
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted(folder.iterdir()):
            if path.is_file():
                z.write(path, (rename or {}).get(path.name, path.name))
    return archive


@pytest.fixture()
def specs(tmp_path, monkeypatch) -> dict[str, str]:
    """The tiny model as a shipped name, a folder, an NLPL .zip and an http URL of that .zip
    (served from 127.0.0.1 by the test)."""
    folder = tmp_path / "folder"
    shutil.copytree(TINY_FOLDER, folder)
    served = tmp_path / "served"
    served.mkdir()
    archive = _zip(TINY_FOLDER, served / "tiny.zip", {"weights.hdf5": "model.hdf5"})
    handler = functools.partial(_QuietHandler, directory=str(served))
    monkeypatch.delenv("ELMOKIT_OFFLINE", raising=False)
    with running(LocalServer(handler)) as server:
        yield {"name": TINY_REFERENCE, "folder": str(folder), "zip": str(archive), "url": server.url("/tiny.zip")}


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # noqa: ANN002
        pass


def _elmo_outputs(elmo: Elmo) -> torch.Tensor:
    with torch.no_grad():
        return elmo(batch_to_ids(SENTENCES))["elmo_representations"][0]


def test_allennlp_classes_take_every_spec_as_the_options_file(specs):
    expected = _elmo_outputs(Elmo(OPTIONS, WEIGHTS, 1, dropout=0))
    embedded = ElmoEmbedder(str(OPTIONS), str(WEIGHTS)).embed_sentence(SENTENCES[0])
    assert expected.shape == (2, 4, 32)
    for form, spec in specs.items():
        assert torch.equal(_elmo_outputs(Elmo(spec, None, 1, dropout=0)), expected), form
        keyword = Elmo(options_file=spec, weight_file=None, num_output_representations=1, dropout=0)
        assert torch.equal(_elmo_outputs(keyword), expected), form
        np.testing.assert_array_equal(ElmoEmbedder(spec).embed_sentence(SENTENCES[0]), embedded)
        token_embedder = ElmoTokenEmbedder(spec, dropout=0)
        with torch.no_grad():
            assert torch.equal(token_embedder(batch_to_ids(SENTENCES)), expected), form


def test_simple_elmo_and_manylangs_take_every_spec(specs, tmp_path):
    reference = ElmoModel()
    reference.load(str(TINY_FOLDER))
    expected = reference.get_elmo_vectors(SENTENCES)
    for form, spec in specs.items():
        model = ElmoModel()
        assert model.load(spec) == "The model is now loaded."
        np.testing.assert_array_equal(model.get_elmo_vectors(SENTENCES), expected, err_msg=form)
    # ELMoForManyLangs' model as NLPL publishes it: a .zip of its folder beside configs/
    archive = tmp_path / "manylangs.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted(MANYLANGS.parent.rglob("*")):
            if path.is_file() and path.parts[len(MANYLANGS.parent.parts)] in ("char-model", "configs"):
                z.write(path, path.relative_to(MANYLANGS.parent))
    sentences = [["Hello", "world", "!"], ["A"]]
    from_folder = ManyLangsEmbedder(MANYLANGS, device="cpu").sents2elmo(sentences, output_layer=-2)
    from_zip = ManyLangsEmbedder(archive, device="cpu").sents2elmo(sentences, output_layer=-2)
    for a, b in zip(from_folder, from_zip):
        np.testing.assert_array_equal(a, b)
    # and a bilm-tf model (any spec), with the numbers of AllenNLP's ElmoEmbedder for one batch
    arrays = ManyLangsEmbedder(specs["zip"], device="cpu").sents2elmo([SENTENCES[0]], output_layer=-2)
    np.testing.assert_allclose(arrays[0], ElmoEmbedder(specs["zip"]).embed_sentence(SENTENCES[0]), atol=1e-6)


def test_flair_embeddings_take_a_spec_as_the_options_file(specs):
    pytest.importorskip("flair")
    from flair.data import Sentence

    from elmokit.integrations.flair import ELMoEmbeddings

    vectors = []
    for embeddings in (
        ELMoEmbeddings(options_file=str(OPTIONS), weight_file=str(WEIGHTS), mode="zero"),
        ELMoEmbeddings(options_file=specs["zip"], mode="zero"),
        ELMoEmbeddings(specs["url"], mode="zero"),
    ):
        sentence = Sentence("The cat sat .")
        embeddings.embed(sentence)
        vectors.append(torch.stack([token.embedding for token in sentence]))
    assert vectors[0].shape == (4, 96)
    assert torch.equal(vectors[0], vectors[1]) and torch.equal(vectors[0], vectors[2])


def test_allennlp_elmo_command_and_embed_file_take_a_spec(specs, tmp_path):
    text = tmp_path / "in.txt"
    text.write_text("The cat sat .\nHello\n", encoding="utf-8")
    pair, archive = tmp_path / "pair.hdf5", tmp_path / "zip.hdf5"
    args = [str(text), "--all", "--batch-size", "1"]
    assert (
        main(
            [
                "elmo",
                args[0],
                str(pair),
                *args[1:],
                "--options-file",
                str(OPTIONS),
                "--weight-file",
                str(WEIGHTS),
            ]
        )
        == 0
    )
    assert main(["elmo", args[0], str(archive), *args[1:], "--options-file", specs["zip"]]) == 0
    ElmoEmbedder(specs["name"]).embed_file(str(text), tmp_path / "api.hdf5", batch_size=1)
    with h5py.File(pair) as a, h5py.File(archive) as b, h5py.File(tmp_path / "api.hdf5") as c:
        for key in ("0", "1"):
            np.testing.assert_array_equal(a[key][()], b[key][()])
            np.testing.assert_array_equal(a[key][()], c[key][()])


def test_a_model_beside_a_weight_file_or_no_model_is_one_line(specs, capsys, tmp_path):
    with pytest.raises(ValueError, match=r"tiny\.zip is a model archive, not an options file: give it alone"):
        Elmo(specs["zip"], WEIGHTS, 1)
    with pytest.raises(ValueError, match=r"^no model given: pass a shipped or known model's name"):
        Elmo(None, None, 1)
    with pytest.raises(ValueError, match=r"^a weight file needs its options file"):
        ElmoEmbedder(None, WEIGHTS)
    text = tmp_path / "in.txt"
    text.write_text("Hello\n", encoding="utf-8")
    out = tmp_path / "out.hdf5"
    code = main(
        ["elmo", str(text), str(out), "--all", "--options-file", specs["zip"], "--weight-file", str(WEIGHTS)]
    )
    assert code == 2
    error = capsys.readouterr().err
    assert error.startswith("elmokit: error: ") and "is a model archive, not an options file" in error
    assert error.count("\n") == 1 and not out.exists()


@pytest.mark.usefixtures("hub")
def test_an_hf_repository_as_the_options_file():
    """``hf://owner/name`` through the stand-in Hub of tests/hub/test_hub.py."""
    expected = _elmo_outputs(Elmo(OPTIONS, WEIGHTS, 1, dropout=0))
    assert torch.equal(_elmo_outputs(Elmo(f"hf://{REPO}", None, 1, dropout=0)), expected)
    model = ElmoModel()
    model.load(f"hf://{REPO}")
    assert model.get_elmo_vectors(SENTENCES).shape == (2, 4, 32)
