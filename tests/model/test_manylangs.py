"""ELMoForManyLangs models (elmokit.model.manylangs) against the numbers ELMoForManyLangs' own code
computed with them (tests/fixtures/elmoformanylangs, see tests/fixtures/PROVENANCE.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from elmokit import BiLM, Embedder, StatefulBiLM
from elmokit.cli import main
from elmokit.compat.manylangs import ManyLangsEmbedder
from elmokit.hub.resolve import is_manylangs_folder
from elmokit.model.manylangs import (
    CONFIGS_DIR,
    ManyLangsError,
    ManyLangsInputs,
    model_config_file,
    read_dictionary,
    read_model_config,
)

from ..conftest import FIXTURES

HERE = FIXTURES / "elmoformanylangs"
MODELS = ("word-model", "char-model")  # with and without a word embedding
ATOL = 1e-5


def _reference(model: str) -> tuple[dict, np.lib.npyio.NpzFile]:
    folder = HERE / model
    return json.loads((folder / "reference.json").read_text(encoding="utf-8")), np.load(
        folder / "reference.npz"
    )


def _layer(array: np.ndarray, output_layer: int) -> np.ndarray:
    """sents2elmo's output_layer of an Embedder array (num_layers, n_tokens, dim)."""
    if output_layer == -2:
        return array
    return array.mean(axis=0) if output_layer == -1 else array[output_layer]


def _replay(call: dict, batch_size: int, embed) -> dict[int, np.ndarray]:
    """A sents2elmo call as ELMoForManyLangs ran it: sentences sorted by length (longest first,
    stable), batches of batch_size, run in the recorded order; ``embed`` embeds one batch."""
    sentences = call["sentences"]
    order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    assert sorted(call["batch_order"]) == list(range(len(batches)))
    outputs: dict[int, np.ndarray] = {}
    for b in call["batch_order"]:
        outputs.update(zip(batches[b], embed([sentences[i] for i in batches[b]])))
    return outputs


def _compare(expected: np.ndarray, actual: np.ndarray, what: str) -> float:
    assert actual.shape == expected.shape and actual.dtype == np.float32, what
    np.testing.assert_allclose(actual, expected, rtol=0, atol=ATOL, err_msg=what)
    return float(np.abs(actual - expected).max()) if expected.size else 0.0


@pytest.mark.parametrize("model", MODELS)
def test_stateful_embedder_gives_elmoformanylangs_numbers(model):
    """Embedder(folder, mode="stateful") on the recorded sequence of sents2elmo calls: every
    output layer of every sentence, states carried row by row from batch to batch and call to
    call (batches of 1 to 4 rows, growing and shrinking)."""
    reference, arrays = _reference(model)
    embedder = Embedder(HERE / model, mode="stateful", batch_size=4)
    assert isinstance(embedder.bilm.inputs, ManyLangsInputs)
    calls = reference["stateful"]["calls"]
    assert len(calls) == 12 and {c["output_layer"] for c in calls} == {-2, -1, 0, 1, 2}
    compared = 0
    for c, call in enumerate(calls):
        outputs = _replay(call, 4, embedder.embed_batch)
        for i in range(len(call["sentences"])):
            expected = arrays[f"stateful/{c}/{i}"]
            _compare(expected, _layer(outputs[i], call["output_layer"]), f"call {c}, sentence {i}")
            compared += expected.size
    assert compared > 15_000


@pytest.mark.parametrize("model", MODELS)
def test_sents2elmo_gives_elmoformanylangs_numbers_edge_cases_included(model):
    """ManyLangsEmbedder.sents2elmo, ELMoForManyLangs' own API, on both recorded sequences: the
    stateful one and the one with empty sentences and empty tokens (which move their row's
    state), each call given its batches in the recorded order."""
    reference, arrays = _reference(model)
    for sequence in ("stateful", "edge"):
        batch_size = reference[sequence]["batch_size"]
        embedder = ManyLangsEmbedder(HERE / model, batch_size=batch_size, device="cpu")
        for c, call in enumerate(reference[sequence]["calls"]):

            def embed(batch, embedder=embedder, layer=call["output_layer"]):
                return embedder.sents2elmo(batch, output_layer=layer)

            outputs = _replay(call, batch_size, embed)
            for i in range(len(call["sentences"])):
                _compare(arrays[f"{sequence}/{c}/{i}"], outputs[i], f"{sequence} call {c}, sentence {i}")
    empty = reference["edge"]["calls"][2]["sentences"]
    assert empty == [[], []] and arrays["edge/2/0"].shape == (3, 0, 32)


def test_sents2elmo_runs_a_call_in_batches_longest_first():
    """One call of 6 sentences in batches of 4 gives the numbers ELMoForManyLangs gave when its
    random batch order happened to be longest first (recorded call 10 of the sequence)."""
    reference, arrays = _reference("char-model")
    calls = reference["stateful"]["calls"]
    assert calls[10]["batch_order"] == [0, 1]
    embedder = ManyLangsEmbedder(HERE / "char-model", batch_size=4, device="cpu")
    for call in calls[:10]:
        _replay(call, 4, lambda batch, layer=call["output_layer"]: embedder.sents2elmo(batch, layer))
    outputs = embedder.sents2elmo(calls[10]["sentences"], output_layer=-2)
    for i, output in enumerate(outputs):
        _compare(arrays[f"stateful/10/{i}"], output, f"sentence {i}")
    with pytest.raises(ValueError, match=r"^output_layer must be -2 \(all layers\), -1 .* 0\.\.2, got 3$"):
        embedder.sents2elmo([["a"]], output_layer=3)


@pytest.mark.parametrize("model", MODELS)
def test_stateless_model_gives_each_sentence_alone_its_fresh_numbers(model):
    """BiLM.from_pretrained(stateful=False): every sentence starts from zeros, so its vectors are those
    of a fresh ELMoForManyLangs Embedder given that sentence alone, in any batch and after any
    other call."""
    reference, arrays = _reference(model)
    sentences = reference["fresh"]["sentences"]
    bilm = BiLM.from_pretrained(HERE / model)
    assert not bilm.stateful and not isinstance(bilm, StatefulBiLM) and not bilm.training
    embedder = Embedder(bilm, batch_size=3)
    others = [["Shaw", "was", "selected", "."], ["日本語", "の"]]
    for i, sentence in enumerate(sentences):
        expected = arrays[f"fresh/{i}"]
        _compare(expected, embedder.embed_sentence(sentence), f"alone {i}")
        embedder.embed_batch(others)
        _compare(expected, embedder.embed_batch([*others, sentence])[-1], f"in a batch {i}")
    with torch.no_grad():
        out = bilm(bilm.batch_to_ids(sentences))
        again = bilm(bilm.batch_to_ids(sentences[::-1]))
    for i, sentence in enumerate(sentences):
        n = len(sentence)
        _compare(arrays[f"fresh/{i}"], out.layers[:, i, :n].numpy(), f"forward {i}")
        _compare(arrays[f"fresh/{i}"], again.layers[:, len(sentences) - 1 - i, :n].numpy(), f"reversed {i}")


def test_stateful_model_carries_states_and_resets():
    reference, arrays = _reference("word-model")
    bilm = BiLM.from_pretrained(HERE / "word-model", stateful=True)
    assert bilm.stateful and isinstance(bilm, StatefulBiLM) and isinstance(bilm.inputs, ManyLangsInputs)
    first = reference["stateful"]["calls"][0]  # one batch, the first call of a fresh Embedder
    order = sorted(range(3), key=lambda i: -len(first["sentences"][i]))
    with torch.no_grad():
        for _ in range(2):
            out = bilm(bilm.batch_to_ids([first["sentences"][i] for i in order]))
            bilm.reset_states()
    for row, i in enumerate(order):
        n = len(first["sentences"][i])
        _compare(arrays[f"stateful/0/{i}"], out.layers[:, row, :n].numpy(), f"sentence {i}")


def test_serializations_and_config_pointers_of_the_fixtures():
    """The word model's .pkl files use torch's legacy serialization (as the published models
    do), the char model's the zip format; both point to ../configs/<name>.json."""
    for name in ("token_embedder.pkl", "encoder.pkl"):
        assert (HERE / "word-model" / name).read_bytes()[:2] == b"\x80\x02"  # a plain pickle stream
        assert (HERE / "char-model" / name).read_bytes()[:2] == b"PK"  # a zip archive
    for model, config in (("word-model", "tiny_word.json"), ("char-model", "tiny_char.json")):
        settings = json.loads((HERE / model / "config.json").read_text())
        assert settings["config_path"] == f"../configs/{config}"
        assert model_config_file(HERE / model) == HERE / model / ".." / "configs" / config
        assert is_manylangs_folder(HERE / model)
    assert not is_manylangs_folder(FIXTURES / "elmo-tiny") and not is_manylangs_folder(HERE)


def _copy_model(tmp_path: Path, model: str = "word-model", configs: bool = True) -> Path:
    """A copy of a fixture model (and of ../configs/ beside it, unless ``configs`` is False)."""
    folder = tmp_path / model
    shutil.copytree(HERE / model, folder, ignore=shutil.ignore_patterns("reference.*"))
    if configs:
        shutil.copytree(HERE / "configs", tmp_path / "configs")
    return folder


def _set_config_path(folder: Path, config_path: str) -> None:
    settings = json.loads((folder / "config.json").read_text())
    settings["config_path"] = config_path
    (folder / "config.json").write_text(json.dumps(settings))


def test_config_found_where_elmoformanylangs_looks(tmp_path):
    """config_path from the folder, else its file name in the folder, else elmokit's copies of
    the configs in ELMoForManyLangs' package (what a published model's ../configs/ needs)."""
    reference, arrays = _reference("char-model")
    folder = _copy_model(tmp_path, "char-model", configs=False)  # its ../configs/ is not there
    with pytest.raises(
        FileNotFoundError, match=r"its model config '\.\./configs/tiny_char\.json' is neither"
    ):
        BiLM.from_pretrained(folder)
    shutil.copy(HERE / "configs" / "tiny_char.json", folder)
    _set_config_path(folder, str(tmp_path / "authors" / "machine" / "tiny_char.json"))  # absolute, absent
    assert model_config_file(folder) == folder / "tiny_char.json"
    out = Embedder(folder, mode="zero").embed_sentence(reference["fresh"]["sentences"][0])
    _compare(arrays["fresh/0"], out, "config beside the model")

    _set_config_path(folder, "../configs/cnn_50_100_512_4096_sample.json")
    assert model_config_file(folder) == CONFIGS_DIR / "cnn_50_100_512_4096_sample.json"
    config = read_model_config(model_config_file(folder))
    assert (config.options.lstm.dim, config.options.lstm.projection_dim, config.options.lstm.n_layers) == (
        4096,
        512,
        2,
    )
    assert (config.word_dim, config.options.char_cnn.embedding_dim, config.options.char_cnn.n_highway) == (
        100,
        50,
        2,
    )
    assert config.options.char_cnn.filters[-1] == (7, 1024) and config.options.output_dim == 1024
    with pytest.raises(
        ManyLangsError, match=r"token_embedder\.pkl: has no 'word_emb_layer\.embedding\.weight'"
    ):
        BiLM.from_pretrained(folder)  # the tiny weights are not those of a 4096-cell model


@pytest.mark.parametrize("name", ["config.json", "char.dic", "word.dic", "token_embedder.pkl", "encoder.pkl"])
def test_a_missing_file_is_named_in_one_line(tmp_path, name, capsys):
    folder = _copy_model(tmp_path)
    (folder / name).unlink()
    with pytest.raises(FileNotFoundError) as err:
        BiLM.from_pretrained(folder)
    # without config.json the folder is read as bilm-tf's, whose options.json it lacks
    assert ("options.json" if name == "config.json" else name) in str(err.value)
    assert "\n" not in str(err.value)
    if name != "config.json":  # without it the folder is not an ELMoForManyLangs folder at all
        assert is_manylangs_folder(folder)
        assert main(["embed", "-", str(tmp_path / "out.hdf5"), "--model", str(folder), "--quiet"]) == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith("elmokit: error: ") and name in error and "\n" not in error


class _Exploit:
    """Unpickling this would call _record: weights_only must refuse it before that."""

    calls: list[str] = []

    def __reduce__(self):
        return (_record, ("unpickled",))


def _record(value: str) -> str:
    _Exploit.calls.append(value)
    return value


def test_pickles_holding_anything_but_tensors_are_refused(tmp_path):
    folder = _copy_model(tmp_path, "char-model")
    state = torch.load(folder / "encoder.pkl", weights_only=True)
    torch.save({**state, "extra": _Exploit()}, folder / "encoder.pkl")
    with pytest.raises(
        ManyLangsError,
        match=r"encoder\.pkl: refused to load: it names the Python global tests\.model\.test_manylangs\._record, "
        r"which could run code; elmokit never runs code from a model file$",
    ):
        BiLM.from_pretrained(folder)
    assert _Exploit.calls == []
    for name, value, found in (
        ("forward_layer_0.state_linearity.bias", 3, "int"),
        ("forward_layer_0.state_linearity.bias", torch.zeros(96, dtype=torch.long), "torch.int64"),
    ):
        torch.save({**state, name: value}, folder / "encoder.pkl", _use_new_zipfile_serialization=False)
        with pytest.raises(
            ManyLangsError, match=rf"encoder\.pkl: {name} is {found}, not a floating-point tensor$"
        ):
            BiLM.from_pretrained(folder)
    bad = dict(state)
    bad["backward_layer_1.state_projection.weight"] = torch.full((16, 24), float("nan"))
    torch.save(bad, folder / "encoder.pkl")
    with pytest.raises(
        ManyLangsError, match=r"backward_layer_1\.state_projection\.weight holds NaN or infinity$"
    ):
        BiLM.from_pretrained(folder)
    bad["backward_layer_1.state_projection.weight"] = torch.zeros(16, 25)
    torch.save(bad, folder / "encoder.pkl")
    with pytest.raises(ManyLangsError, match=r"has shape \(16, 25\), the config gives \(16, 24\)$"):
        BiLM.from_pretrained(folder)
    del bad["backward_layer_1.state_projection.weight"]
    torch.save(bad, folder / "encoder.pkl")
    with pytest.raises(
        ManyLangsError, match=r"encoder\.pkl: has no 'backward_layer_1\.state_projection\.weight'"
    ):
        BiLM.from_pretrained(folder)
    (folder / "encoder.pkl").write_bytes(b"not a pickle")
    with pytest.raises(ManyLangsError, match=r"^.*encoder\.pkl: (not a torch file of tensors|cannot read this torch file)"):
        BiLM.from_pretrained(folder)


def test_dictionaries_read_as_elmoformanylangs_reads_them(tmp_path):
    folder = _copy_model(tmp_path, "char-model")
    bilm = BiLM.from_pretrained(folder)
    chars = bilm.inputs.chars
    # ELMoForManyLangs begins a word with <eow>'s id and ends it with <bow>'s (its swap), pads with <pad>
    ids = bilm.token_ids(["ab", "<bos>", "x\u2603"]) - 1
    assert ids[0, :5].tolist() == [chars["<eow>"], chars["a"], chars["b"], chars["<bow>"], chars["<pad>"]]
    assert ids[1, :4].tolist() == [chars["<eow>"], chars["<bos>"], chars["<bow>"], chars["<pad>"]]
    assert ids[2, :4].tolist() == [chars["<eow>"], chars["x"], chars["<oov>"], chars["<bow>"]]
    assert torch.equal(bilm.token_ids(["<bos>", "<eos>"]), bilm._boundary_ids)
    long = bilm.token_ids(["a" * 30])[0] - 1  # 20 characters per token: 18 kept
    assert long.tolist() == [chars["<eow>"], *[chars["a"]] * 18, chars["<bow>"]]
    words = BiLM.from_pretrained(HERE / "word-model").inputs.words
    word_ids = BiLM.from_pretrained(HERE / "word-model").token_ids(
        ["Representatives", "Representative", "zzz", "<eos>"]
    )
    assert word_ids[:, -1].tolist() == [words["Representative"] + 1] * 2 + [
        words["<oov>"] + 1,
        words["<eos>"] + 1,
    ]

    lines = (folder / "char.dic").read_text(encoding="utf-8").splitlines()
    (folder / "char.dic").write_text(
        "\n".join(line for line in lines if not line.startswith("<bow>")) + "\n", encoding="utf-8"
    )
    with pytest.raises(ManyLangsError, match=r"char\.dic: has no entry for <bow>$"):
        BiLM.from_pretrained(folder)
    (folder / "char.dic").write_text("\n".join([*lines, "ü\tseven"]) + "\n", encoding="utf-8")
    with pytest.raises(
        ManyLangsError, match=rf"char\.dic: line {len(lines) + 1}: the id 'seven' is not an integer$"
    ):
        BiLM.from_pretrained(folder)
    (folder / "char.dic").write_text("\n".join([*lines, f"\u2603\t{len(lines)}"]) + "\n", encoding="utf-8")
    with pytest.raises(
        ManyLangsError,
        match=rf"char\.dic: {len(lines) + 1} entries .* but the char embedding has {len(lines)} rows$",
    ):
        BiLM.from_pretrained(folder)
    # ELMoForManyLangs strips each line: a whitespace token is gone and read as U+3000; lines end
    # at Unicode line breaks too; a later line of a token wins
    (folder / "odd.dic").write_text(" \t7\nb\t1\r\na\t2\u2028c\t4\nb\t3\n", encoding="utf-8")
    assert read_dictionary(folder / "odd.dic") == {"\u3000": 7, "b": 3, "a": 2, "c": 4}
    (folder / "odd.dic").write_text("a\t1\tx\n", encoding="utf-8")
    with pytest.raises(ManyLangsError, match=r"odd\.dic: line 1 has 3 tab-separated fields, expected 2$"):
        read_dictionary(folder / "odd.dic")


def test_model_inputs_are_checked(tmp_path):
    bilm = BiLM.from_pretrained(HERE / "word-model")
    ids = bilm.batch_to_ids([["a", "b"], ["c"]])
    assert ids.shape == (2, 2, 17) and ids[1, 1].eq(0).all()
    with pytest.raises(
        ValueError,
        match=r"must have shape \(batch, timesteps, 17\), got \(1, 1, 16\); make them with the model's own batch_to_ids",
    ):
        bilm(ids[:1, :1, :16])
    ids[0, 0, -1] = 1427
    with pytest.raises(ValueError, match=r"^word ids must lie in 0\.\.1426 .*, found 1427$"):
        bilm(ids)
    with pytest.raises(TypeError, match="sentence 0 is a str"):
        bilm.batch_to_ids(["a b"])
    assert bilm.encode_tokens(["café", "Representatives"]).shape == (2, 16)
    with pytest.raises(ValueError, match="cannot be written in bilm-tf's layout"):
        bilm.save(tmp_path / "options.json", tmp_path / "weights.hdf5")


def test_cli_embed_reads_a_manylangs_folder(tmp_path, capsys):
    reference, arrays = _reference("word-model")
    sentences = reference["fresh"]["sentences"]
    text = tmp_path / "in.txt"
    text.write_text("".join(" ".join(s) + "\n" for s in sentences), encoding="utf-8")
    out = tmp_path / "out.hdf5"
    assert (
        main(["embed", str(text), str(out), "--model", str(HERE / "word-model"), "--mode", "zero", "--quiet"])
        == 0
    )
    with h5py.File(out, "r") as f:
        for i in range(len(sentences)):
            _compare(arrays[f"fresh/{i}"], f[str(i)][()], f"line {i}")
    average = tmp_path / "average.hdf5"
    assert (
        main(
            [
                "embed",
                str(text),
                str(average),
                "--model",
                str(HERE / "word-model"),
                "--mode",
                "zero",
                "--layers",
                "average",
                "--quiet",
            ]
        )
        == 0
    )
    with h5py.File(average, "r") as f:
        _compare(arrays["fresh/1"].mean(axis=0), f["1"][()], "average")
    assert capsys.readouterr().err == ""
