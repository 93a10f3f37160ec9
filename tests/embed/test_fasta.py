"""embed --fasta: a FASTA file of proteins -> the files of bio_embeddings' embed stage (SeqVec),
against what bio_embeddings 0.2.2's own pipeline wrote for 20 proteins (one of 3,000 residues)
on a biLM of SeqVec's architecture (tests/fixtures/bio-embeddings-seqvec/SOURCE.md); the FASTA
reader's one-line refusals; nothing written on a failure."""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import h5py
import numpy as np
import pytest

from elmokit.cli import main
from elmokit.embed.embedder import Embedder
from elmokit.embed.fasta import embed_fasta, pipeline_batches, read_fasta

REFERENCE = Path(__file__).parents[1] / "fixtures" / "bio-embeddings-seqvec"
PROTEINS = REFERENCE / "proteins.fasta"
MODEL = "elmo-tiny-reference"  # tests/fixtures/elmo-tiny, the model of the reference


def _datasets(path: Path) -> dict[str, tuple[np.ndarray, dict]]:
    with h5py.File(path, "r") as f:
        assert not dict(f.attrs)
        return {name: (f[name][()], dict(f[name].attrs)) for name in f}


def _assert_same_files(mine: Path, reference: Path) -> None:
    ours, theirs = _datasets(mine), _datasets(reference)
    assert sorted(ours) == sorted(theirs)
    for name, (expected, attrs) in theirs.items():
        array, our_attrs = ours[name]
        assert our_attrs == attrs, name
        assert array.dtype == expected.dtype == np.float32 and array.shape == expected.shape, name
        np.testing.assert_allclose(array, expected, atol=1e-5, rtol=0, err_msg=name)


@pytest.fixture(scope="module")
def stateful_embedder():
    return Embedder(MODEL, mode="stateful", device="cpu")


@pytest.mark.slow
def test_embed_fasta_command_writes_what_bio_embeddings_writes(tmp_path, capsys):
    out, reduced = tmp_path / "embeddings_file.h5", tmp_path / "reduced.h5"
    argv = ["embed", "--fasta", str(PROTEINS), str(out), "--reduced-output", str(reduced), "--model", MODEL]
    assert main([*argv, "--device", "cpu"]) == 0
    assert "20 proteins, 4,466 residues" in capsys.readouterr().err
    _assert_same_files(out, REFERENCE / "embeddings_file.h5")
    _assert_same_files(reduced, REFERENCE / "reduced_embeddings_file.h5")
    embeddings = _datasets(out)
    with open(REFERENCE / "mapping_file.csv", newline="") as f:
        mapping = list(csv.DictReader(f))
    assert len(mapping) == 20 and int(mapping[0]["sequence_length"]) == 3000
    for row in mapping:  # the MD5 name, the FASTA id, the length, as in bio_embeddings' mapping file
        array, attrs = embeddings[row[""]]
        assert attrs == {"original_id": row["original_id"]} and array.shape[1] == int(row["sequence_length"])
    ids = [attrs["original_id"] for _, attrs in embeddings.values()]
    assert ids.count("sp|Q00002|PROT2_TEST") == 2  # an id on two records: both kept, as bio_embeddings does


@pytest.mark.slow
def test_batches_below_max_amino_acids_carry_other_states(tmp_path, stateful_embedder):
    """max_amino_acids 1,000: the long protein alone, then batches below 1,000 residues; each
    row starts from the states its row ended with in the batch before (stateful)."""
    out, reduced = tmp_path / "e.h5", tmp_path / "r.h5"
    summary = embed_fasta(PROTEINS, out, stateful_embedder, reduced_output=reduced, max_amino_acids=1000)
    assert (summary.proteins, summary.residues) == (20, 4466)
    _assert_same_files(reduced, REFERENCE / "reduced_embeddings_file_max1000.h5")
    default = _datasets(REFERENCE / "reduced_embeddings_file.h5")
    differ = [n for n, (a, _) in _datasets(reduced).items() if np.abs(a - default[n][0]).max() > 1e-4]
    assert len(differ) >= 5, "the batches change the carried states, so the vectors"


def test_pipeline_batches_follow_embed_many():
    assert list(pipeline_batches([3000, 600, 300, 99, 1, 50], 1000)) == [[0], [1, 2, 3], [4, 5]]
    assert list(pipeline_batches([1000, 999, 1], 1000)) == [[0], [1], [2]]  # a batch stays below
    assert list(pipeline_batches([5, 4], None)) == [[0], [1]]
    assert list(pipeline_batches([], 15000)) == []


def test_zero_mode_gives_each_protein_alone_and_simple_remapping_names_by_position(tmp_path):
    fasta = tmp_path / "p.fasta"
    fasta.write_text(">short one\nMKV\n>long\nMKVLLAGW\nPQ\n>mid\nACDEF\n")
    embedder = Embedder(MODEL, mode="zero", device="cpu")
    out, reduced = tmp_path / "e.h5", tmp_path / "r.h5"
    embed_fasta(fasta, out, embedder, reduced_output=reduced, simple_remapping=True)
    got, pooled = _datasets(out), _datasets(reduced)
    assert sorted(got) == ["0", "1", "2"]  # longest first
    for name, (protein, sequence) in zip("012", [("long", "MKVLLAGWPQ"), ("mid", "ACDEF"), ("short", "MKV")]):
        array, attrs = got[name]
        assert attrs == {"original_id": protein}
        np.testing.assert_allclose(array, embedder.embed_sentence(list(sequence)), atol=1e-6, rtol=0)
        np.testing.assert_allclose(pooled[name][0], array.sum(0).mean(0), atol=1e-6, rtol=0)


def test_stateful_proteins_equal_bio_embeddings_calls(tmp_path, stateful_embedder):
    """Warm-up 4 times, then one batch, longest first: what SeqVecEmbedder and embed_many call."""
    fasta = tmp_path / "p.fasta"
    fasta.write_text(">a\nMKV\n>b\nMKVLLAGW\n>c\nACDEFG\n")
    out = tmp_path / "e.h5"
    embed_fasta(fasta, out, stateful_embedder)
    from elmokit.embed.fasta import WARMUP_SEQUENCE

    reference = Embedder(MODEL, mode="stateful", device="cpu")
    for _ in range(4):
        reference.embed_batch([list(WARMUP_SEQUENCE)])
    expected = reference.embed_batch([list("MKVLLAGW"), list("ACDEFG"), list("MKV")])
    got = _datasets(out)
    for sequence, array in zip(["MKVLLAGW", "ACDEFG", "MKV"], expected):
        np.testing.assert_allclose(
            got[hashlib.md5(sequence.encode()).hexdigest()][0], array, atol=1e-5, rtol=0
        )


@pytest.mark.parametrize(
    "text, message",
    [
        ("MKV\n>a\nMKV\n", "line 1: a FASTA file starts with a header line '>ID', not 'MKV'"),
        (">a\nMKV\n> \nMKV\n", "line 3: the header '>' has no id after it"),
        (">a\nMK*\n", "line 2: '*' in the sequence of 'a' is not a residue"),
        (">a\nMK\tV\n", "line 2: '\\t' in the sequence of 'a' is not a residue"),
        (">a first\n\n>b\nMKV\n", "line 1: the record 'a' has no residues"),
        (">a\nMKV\n>b\nMKV\n", "the records 'a' (line 1) and 'b' (line 3) have the same sequence"),
        ("", "no FASTA record"),
        ("\n\n", "no FASTA record"),
    ],
)
def test_malformed_fasta_is_one_line_naming_the_line(tmp_path, capsys, text, message):
    fasta, out = tmp_path / "p.fasta", tmp_path / "out.h5"
    fasta.write_text(text)
    assert main(["embed", "--fasta", str(fasta), str(out), "--model", MODEL, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"elmokit: error: {fasta}: ") and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.fasta"], "nothing written"


def test_reader_keeps_ids_lines_and_case(tmp_path):
    fasta = tmp_path / "p.fasta"
    fasta.write_bytes(b"\xef\xbb\xbf>sp|P1|X one two\r\nMK V\r\n\r\nll\r\n>b\rWW\r")
    records = list(read_fasta(fasta))
    assert [(r.id, r.sequence, r.line) for r in records] == [("sp|P1|X", "MKVll", 1), ("b", "WW", 5)]


def test_identical_sequences_with_simple_remapping_and_duplicate_ids(tmp_path, caplog):
    fasta = tmp_path / "p.fasta"
    fasta.write_text(">a\nMKV\n>a\nMKV\n>c\nmkv\n")
    out = tmp_path / "e.h5"
    embed_fasta(fasta, out, Embedder(MODEL, mode="zero", device="cpu"), simple_remapping=True)
    got = _datasets(out)
    assert [got[n][1]["original_id"] for n in "012"] == ["a", "a", "c"]
    np.testing.assert_array_equal(got["0"][0], got["1"][0])
    assert "lower-case residues" in caplog.text and "names the records of lines 1 and 3" in caplog.text


def test_outputs_are_checked_and_a_failure_leaves_nothing(tmp_path, capsys, monkeypatch):
    fasta = tmp_path / "p.fasta"
    fasta.write_text(">a\nMKV\n>b\nMKVW\n")
    out = tmp_path / "out.h5"
    out.write_bytes(b"mine")
    base = ["embed", "--fasta", str(fasta), "--model", MODEL, "--device", "cpu"]
    assert main([*base, str(out)]) == 2
    assert (
        capsys.readouterr().err
        == f"elmokit: error: {out} exists; pass overwrite=True (--overwrite) to replace it\n"
    )
    assert main([*base, str(fasta), "--overwrite"]) == 2
    assert "is the input file" in capsys.readouterr().err
    assert main([*base, str(tmp_path / "x.h5"), "--pooling", "mean"]) == 2
    assert capsys.readouterr().err == (
        "elmokit: error: --pooling does not go with --fasta (it writes bio_embeddings' layout, all layers)\n"
    )
    with pytest.raises(SystemExit, match="^2$"):
        main(["embed", str(tmp_path / "x.h5"), "--model", MODEL])
    assert capsys.readouterr().err == (
        "elmokit: error: the following arguments are required: output; see 'elmokit embed --help'\n"
    )

    calls = []
    real = Embedder.embed_batch

    def failing(self, sentences):
        calls.append(len(sentences))
        if len(calls) > 5:  # after the warm-up and one protein
            raise OSError(28, "No space left on device")
        return real(self, sentences)

    monkeypatch.setattr(Embedder, "embed_batch", failing)
    reduced = tmp_path / "r.h5"
    assert main([*base, str(out), "--overwrite", "--reduced-output", str(reduced)]) == 2
    assert capsys.readouterr().err == (
        f"elmokit: error: {out} was not written: the disk is full (no space left on device); no partial file was left\n"
    )
    assert out.read_bytes() == b"mine" and sorted(p.name for p in tmp_path.iterdir()) == ["out.h5", "p.fasta"]
