"""flair on elmokit: flair's own ELMoEmbeddings through elmokit.compat.install_allennlp_modules,
a SequenceTagger trained one epoch on CoNLL-2003 sentences with it, and
elmokit.integrations.flair.ELMoEmbeddings (same numbers, deterministic modes, save and load)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("flair")

from flair.data import Sentence  # noqa: E402
from flair.datasets import ColumnCorpus  # noqa: E402
from flair.models import SequenceTagger  # noqa: E402
from flair.trainers import ModelTrainer  # noqa: E402

from elmokit.compat import install_allennlp_modules, uninstall_allennlp_modules  # noqa: E402
from elmokit.compat.allennlp import ElmoEmbedder  # noqa: E402
from elmokit.hub.entries import OfflineError  # noqa: E402
from elmokit.integrations.flair import ELMoEmbeddings  # noqa: E402

from ..conftest import FIXTURES  # noqa: E402

CONLL = FIXTURES / "conll2003-tiny"
TEXTS = ["The cat sat on the mat .", "EU rejects German call to boycott British lamb .", "Peter Blackburn"]


@pytest.fixture()
def flair_elmo():
    """flair's own ELMoEmbeddings class, its `import allennlp.commands.elmo` served by elmokit."""
    install_allennlp_modules()
    try:
        from flair.embeddings import ELMoEmbeddings as FlairELMoEmbeddings

        yield FlairELMoEmbeddings
    finally:
        uninstall_allennlp_modules()


def _vectors(sentences: list[Sentence], name: str | None = None) -> list[np.ndarray]:
    return [np.stack([t.get_embedding([name] if name else None).cpu().numpy() for t in s]) for s in sentences]


def _allennlp_sequence(tiny_files, batches: list[list[str]]) -> list[np.ndarray]:
    """What flair + AllenNLP compute: the constructor's dummy sentence, then each batch, stateful."""
    embedder = ElmoEmbedder(*tiny_files)
    embedder.embed_batch([["hello"]])
    out = []
    for batch in batches:
        out += embedder.embed_batch([text.split() for text in batch])
    return out


def test_flairs_own_elmo_embeddings_run_on_elmokit(flair_elmo, tiny_files):
    embeddings = flair_elmo(options_file=str(tiny_files[0]), weight_file=str(tiny_files[1]))
    assert type(embeddings.ee).__module__ == "elmokit.compat.allennlp"
    assert embeddings.embedding_length == 96
    batches = [TEXTS[:2], TEXTS[2:]]
    sentences = [[Sentence(text) for text in batch] for batch in batches]
    for batch in sentences:
        embeddings.embed(batch)
    expected = _allennlp_sequence(tiny_files, batches)
    for got, want in zip(_vectors(sentences[0] + sentences[1]), expected):
        np.testing.assert_array_equal(got, want.transpose(1, 0, 2).reshape(len(want[0]), -1))

    top = flair_elmo(options_file=str(tiny_files[0]), weight_file=str(tiny_files[1]), embedding_mode="top")
    assert top.embedding_length == 32


def test_flair_elmo_embeddings_without_files_name_the_missing_download(flair_elmo):
    with pytest.raises(OfflineError, match=r"^https://\S+_options.json is not in the download cache"):
        flair_elmo("small")  # the tests run with ELMOKIT_OFFLINE=1 (conftest.py)


def _corpus() -> ColumnCorpus:
    return ColumnCorpus(
        CONLL, {0: "text", 3: "ner"}, train_file="train.txt", dev_file="dev.txt", test_file="test.txt"
    )


def _train_one_epoch(embeddings, tmp_path) -> tuple[SequenceTagger, dict]:
    torch.manual_seed(0)
    corpus = _corpus()
    assert (len(corpus.train), len(corpus.dev), len(corpus.test)) == (12, 4, 4)
    tagger = SequenceTagger(
        hidden_size=16,
        embeddings=embeddings,
        tag_dictionary=corpus.make_label_dictionary("ner"),
        tag_type="ner",
        use_crf=True,
    )
    before = [p.detach().clone() for p in tagger.parameters() if p.requires_grad]
    # flair cannot save a model with its own ELMoEmbeddings (it has no to_params): no model files
    result = ModelTrainer(tagger, corpus).train(
        tmp_path,
        max_epochs=1,
        mini_batch_size=4,
        learning_rate=0.1,
        save_final_model=False,
        use_final_model_for_eval=True,
        create_file_logs=False,
        create_loss_file=False,
    )
    after = [p.detach() for p in tagger.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "training changed the tagger"
    return tagger, result


def test_flair_sequence_tagger_trains_with_flairs_elmo_embeddings(flair_elmo, tiny_files, tmp_path):
    embeddings = flair_elmo(options_file=str(tiny_files[0]), weight_file=str(tiny_files[1]))
    tagger, result = _train_one_epoch(embeddings, tmp_path)
    assert np.isfinite(result["test_score"]) and 0.0 <= result["test_score"] <= 1.0
    sentence = Sentence("EU rejects German call to boycott British lamb .")
    tagger.predict(sentence)
    assert {label.value for label in sentence.get_labels("ner")} <= {"PER", "ORG", "LOC", "MISC"}


def test_integration_gives_flairs_numbers_in_stateful_mode(tiny_files):
    embeddings = ELMoEmbeddings(options_file=tiny_files[0], weight_file=tiny_files[1])
    assert (embeddings.embedding_length, embeddings.name) == (96, "elmo-original-all")
    batches = [TEXTS[:2], TEXTS[2:]]
    sentences = [[Sentence(text) for text in batch] for batch in batches]
    for batch in sentences:
        embeddings.embed(batch)
    expected = _allennlp_sequence(tiny_files, batches)
    for got, want in zip(_vectors(sentences[0] + sentences[1]), expected):
        np.testing.assert_array_equal(got, want.transpose(1, 0, 2).reshape(len(want[0]), -1))


@pytest.mark.parametrize("embedding_mode, length", [("top", 32), ("average", 32)])
def test_integration_embedding_modes(tiny_files, embedding_mode, length):
    embeddings = ELMoEmbeddings("elmo-tiny-reference", embedding_mode=embedding_mode, mode="zero")
    sentence = Sentence(TEXTS[0])
    embeddings.embed(sentence)
    layers = ElmoEmbedder(*tiny_files).embed_sentence(TEXTS[0].split())  # zeros start, as mode="zero"
    want = layers[2] if embedding_mode == "top" else layers.mean(axis=0)
    assert embeddings.embedding_length == length
    np.testing.assert_allclose(_vectors([sentence])[0], want, atol=1e-6)


def test_integration_deterministic_modes_do_not_depend_on_other_sentences():
    embeddings = ELMoEmbeddings("elmo-tiny-reference", mode="warm")
    alone, in_batch = Sentence(TEXTS[1]), [Sentence(TEXTS[0]), Sentence(TEXTS[1])]
    embeddings.embed(in_batch)
    embeddings.embed(alone)
    np.testing.assert_allclose(_vectors([alone])[0], _vectors([in_batch[1]])[0], atol=1e-5)
    stateful = ELMoEmbeddings("elmo-tiny-reference")
    first, second = Sentence(TEXTS[1]), Sentence(TEXTS[1])
    stateful.embed(first)
    stateful.embed(second)
    assert not np.allclose(_vectors([first])[0], _vectors([second])[0], atol=1e-4)
    with pytest.raises(ValueError, match="mode must be one of stateful, warm, zero"):
        ELMoEmbeddings("elmo-tiny-reference", mode="sometimes")
    with pytest.raises(OfflineError, match="ELMOKIT_OFFLINE=1 forbids downloading it"):
        ELMoEmbeddings("pubmed")


def test_tagger_with_integration_trains_saves_and_loads(tmp_path):
    embeddings = ELMoEmbeddings("elmo-tiny-reference", mode="warm")
    tagger, _ = _train_one_epoch(embeddings, tmp_path)
    tagger.save(tmp_path / "tagger.pt")
    loaded = SequenceTagger.load(tmp_path / "tagger.pt")
    assert isinstance(loaded.embeddings, ELMoEmbeddings) and loaded.embeddings.mode == "warm"
    for a, b in zip(tagger.state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(a, b)
    original, restored = Sentence(TEXTS[1]), Sentence(TEXTS[1])
    tagger.embeddings.embed(original)
    loaded.embeddings.embed(restored)
    np.testing.assert_array_equal(_vectors([original])[0], _vectors([restored])[0])
    original, restored = Sentence(TEXTS[1]), Sentence(TEXTS[1])
    tagger.predict(original)
    loaded.predict(restored)
    assert [(s.text, s.tag) for s in original.get_spans("ner")] == [
        (s.text, s.tag) for s in restored.get_spans("ner")
    ]


def test_flairs_elmo_embeddings_pickle_through_its_setstate(flair_elmo, tiny_files):
    """flair's ELMoEmbeddings.__setstate__ moves `ee.elmo_bilm._elmo_lstm._states` (AllenNLP's
    layout) to flair's device: the carried states survive a pickle round trip."""
    import pickle

    embeddings = flair_elmo(options_file=str(tiny_files[0]), weight_file=str(tiny_files[1]))
    embeddings.embed([Sentence(TEXTS[0]), Sentence(TEXTS[1])])
    h, c = embeddings.ee.elmo_bilm._elmo_lstm._states
    assert h.shape == (2, 2, 32) and c.shape == (2, 2, 128)
    copy = pickle.loads(pickle.dumps(embeddings))
    original, restored = Sentence(TEXTS[2]), Sentence(TEXTS[2])
    embeddings.embed(original)
    copy.embed(restored)
    np.testing.assert_array_equal(_vectors([original])[0], _vectors([restored])[0])


def test_a_saved_tagger_loads_in_a_fresh_process_without_importing_elmokit(tmp_path):
    """flair looks the embeddings class up by name; the saved parameters name the class itself,
    so loading the model imports elmokit.integrations.flair, which registers it."""
    import os
    import subprocess
    import sys

    corpus = _corpus()
    torch.manual_seed(0)
    tagger = SequenceTagger(
        hidden_size=8,
        embeddings=ELMoEmbeddings("elmo-tiny-reference", embedding_mode="top", mode="warm"),
        tag_dictionary=corpus.make_label_dictionary("ner"),
        tag_type="ner",
        use_crf=False,
    )
    tagger.save(tmp_path / "tagger.pt")
    sentence = Sentence(TEXTS[1])
    tagger.embeddings.embed(sentence)
    np.save(tmp_path / "expected.npy", _vectors([sentence])[0])
    script = (
        "import sys, numpy as np, torch\n"
        "torch.set_num_threads(int(sys.argv[3]))  # this process's: sums in the same order\n"
        "from flair.data import Sentence\n"
        "from flair.models import SequenceTagger\n"
        "assert 'elmokit' not in sys.modules\n"
        "tagger = SequenceTagger.load(sys.argv[1])\n"
        f"sentence = Sentence({TEXTS[1]!r})\n"
        "tagger.embeddings.embed(sentence)\n"
        "vectors = torch.stack([t.get_embedding() for t in sentence]).numpy()\n"
        "np.testing.assert_array_equal(vectors, np.load(sys.argv[2]))\n"
        "print(type(tagger.embeddings).__module__)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            str(tmp_path / "tagger.pt"),
            str(tmp_path / "expected.npy"),
            str(torch.get_num_threads()),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "elmokit.integrations.flair"
