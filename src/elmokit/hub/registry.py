"""The known public ELMo models: name, language, publisher, files (URLs), and where each fact
comes from.

A model is one archive (NLPL's .zip with options.json, model.hdf5 and usually vocab.txt;
ELMoForManyLangs' folders; SeqVec's zip; CLARIN.SI's and HIT-SCIR's tar archives) or an options
file + weight file pair (AllenNLP's published models), with, where its publisher gives them, the
softmax and vocabulary of the language model (``lm_files``: for scoring and substitutes).
Sizes and checksums are recorded only where the publisher gives them; a file without them is
checked for its kind (zip, tar, JSON, HDF5, text) before it is cached, and the sha256 of its
first download is kept in the cache entry, so a later change is noticed. Fields that a publisher
does not state (licence, output size) are None, shown as "-".

Sources (each entry's ``source`` names its own):
- AllenNLP: the "Pre-trained ELMo Models" and "Contributed ELMo Models" tables of
  https://allennlp.org/elmo (allenai/allennlp-website, elmo.html). The German and Basque
  contributed models are links to repositories, not files, and Transformer ELMo is another
  architecture: they are not listed (the German one is T-Systems', below).
- The 5.5B model's softmax and vocabulary: facebookresearch/LAMA download_models.sh ("ELMO
  ORIGINAL 5.5B": ..._5.5B_softmax_weights.hdf5 and tf_checkpoint/vocab-enwiki-news-500000.txt
  beside the options and weights, on AllenNLP's S3); the file holds softmax/W (vocab, 512) and
  softmax/b, as LAMA's elmo_connector and elmokit's softmax.hdf5 read them. AllenNLP's pages
  publish no size or checksum for it.
- NLPL repository (http://vectors.nlpl.eu/repository/, IDs are persistent): NorELMo, IDs 210,
  211, 217, 218 (https://wiki.nlpl.eu/Vectors/norlm/norelmo); English 209, German 201, Swedish
  202, Latin 203 (the model list of akutuzov/semeval2020's README, by an NLPL maintainer);
  Russian 195, 196, 212 (RusVectores models, IDs and names as public code downloads them; the
  catalogue itself, 20.json, was not available to check).
- ELMoForManyLangs (HIT-SCIR): the 44 languages of the Downloads table of
  HIT-SCIR/ELMoForManyLangs' README, NLPL IDs 136-179 under repository version 11. Output size
  1024: the README says the biLM uses Peters et al. (2018)'s hyperparameters. The simplified-
  Chinese model is not in the NLPL repository: the README's "ELMo for Simplified Chinese" links
  zhs.model.tar.bz2 on HIT-SCIR's own server (since October 2020; trained on the Xinhua part of
  Chinese Gigaword v5). The repository's MIT licence is its code's; no model licence is stated.
- T-Systems (t-systems-on-site-services-gmbh/german-elmo-model README, "Download Options and
  Weights Files only"): options.json and weights.hdf5 of its GitHub release files_1, with the
  README's md5 sums; BSD-2-Clause is the licence of that repository (its LICENSE file).
- EMBEDDIA (CLARIN.SI item http://hdl.handle.net/11356/1277, "ELMo embeddings models for seven
  languages", Ulčar and Robnik-Šikonja, arXiv:1911.10049): only the Slovenian archive's name,
  slovenian-elmo.tar.gz (a folder slovenian/ with options.json and slovenian-elmo-weights.hdf5),
  is given by public code that downloads it; the item page itself (its other six archives, their
  sizes, checksums and licence) could not be read when this entry was written, so the Croatian,
  Estonian, Finnish, Latvian, Lithuanian and Swedish models are not listed.
- SeqVec: bio_embeddings' defaults.yml (sacdallago/bio_embeddings) for the options and weight
  files; mheinzinger/SeqVec's README for the zip (a folder uniref50_v2 with the two files); the
  md5 sums of kipoi/models' SeqVec/embedding/model.yaml for the rostlab.org files (the model card
  names the SeqVec authors). Output size 1024 as bio_embeddings' SeqVecEmbedder and the card say.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.jsonfiles import read_json
from .entries import is_cached, read_meta
from .file_kinds import Expected, url_kind
from .shipped import MODELS_DIR, available_models

__all__: list[str] = []


@dataclass(frozen=True)
class RemoteFile:
    """One file of a model: its URL, its role ("archive", "options", "weights"; "softmax",
    "vocab" in ``KnownModel.lm_files``) and what the publisher says of it (size in bytes, sha256,
    md5; None where nothing is published)."""

    url: str
    role: str
    size: int | None = None
    sha256: str | None = None
    md5: str | None = None

    @property
    def expected(self) -> Expected:
        kind = {"archive": "zip", "options": "json", "weights": "hdf5", "softmax": "hdf5", "vocab": "text"}[
            self.role
        ]
        if self.role == "archive" and url_kind(self.url) == "tar":
            kind = "tar"
        return Expected(size=self.size, sha256=self.sha256, md5=self.md5, kind=kind)


@dataclass(frozen=True)
class KnownModel:
    """A public model elmokit can download by name. ``format``: "bilm" (bilm-tf/AllenNLP
    layout) or "manylangs" (ELMoForManyLangs). ``dims``: the size of one layer's vectors
    (2 * projection_dim). ``source``: where the entry's facts come from. ``lm_files``: the
    language model's softmax and vocabulary (roles "softmax", "vocab") of an options + weights
    model whose publisher gives them: fetched for ``LanguageModel`` (score, substitutes) and by
    ``elmokit download``, not to embed."""

    name: str
    language: str
    description: str
    publisher: str
    files: tuple[RemoteFile, ...]
    source: str
    dims: int | None = None
    licence: str | None = None
    format: str = "bilm"
    aliases: tuple[str, ...] = field(default=())
    lemmatized: bool = False  # trained on lemmas: it expects lemmatized input, raw text gives poor vectors
    lm_files: tuple[RemoteFile, ...] = ()

    @property
    def archive(self) -> RemoteFile | None:
        return next((f for f in self.files if f.role == "archive"), None)

    def file(self, role: str) -> RemoteFile:
        return next(f for f in self.files if f.role == role)

    @property
    def url(self) -> str:
        """The main URL: the archive, else the weight file."""
        return (self.archive or self.file("weights")).url


_S3 = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/"
_ALLENNLP_SOURCE = "https://allennlp.org/elmo (allenai/allennlp-website elmo.html)"


def _pair(options: str, weights: str, **known: str) -> tuple[RemoteFile, ...]:
    return (
        RemoteFile(options, "options", md5=known.get("options_md5")),
        RemoteFile(weights, "weights", md5=known.get("weights_md5")),
    )


def _allennlp(
    name: str,
    folder: str,
    dims: int,
    params: str,
    aliases: tuple[str, ...],
    corpus: str,
    lm_files: tuple[RemoteFile, ...] = (),
    source: str = _ALLENNLP_SOURCE,
):
    stem = f"{_S3}{folder}/elmo_{folder}"
    return KnownModel(
        name=name,
        language="en",
        description=f"AllenNLP {name.removeprefix('elmo-')} ({folder}, {params} parameters), {corpus}",
        publisher="AllenNLP",
        files=_pair(f"{stem}_options.json", f"{stem}_weights.hdf5"),
        source=source,
        dims=dims,
        aliases=aliases,
        lm_files=lm_files,
    )


_BENCHMARK = "trained on the 1 Billion Word Benchmark"
_S3_55B = f"{_S3}2x4096_512_2048cnn_2xhighway_5.5B/"
ALLENNLP = (
    _allennlp("elmo-small", "2x1024_128_2048cnn_1xhighway", 256, "13.6M", ("small",), _BENCHMARK),
    _allennlp("elmo-medium", "2x2048_256_2048cnn_1xhighway", 512, "28.0M", ("medium",), _BENCHMARK),
    _allennlp("elmo-original", "2x4096_512_2048cnn_2xhighway", 1024, "93.6M", ("original",), _BENCHMARK),
    _allennlp(
        "elmo-original-5.5b",
        "2x4096_512_2048cnn_2xhighway_5.5B",
        1024,
        "93.6M",
        ("original-5.5b", "5.5b", "large"),
        "trained on 5.5B tokens of Wikipedia and WMT 2008-2012 news (AllenNLP's recommended default)",
        lm_files=(
            RemoteFile(f"{_S3_55B}elmo_2x4096_512_2048cnn_2xhighway_5.5B_softmax_weights.hdf5", "softmax"),
            RemoteFile(f"{_S3_55B}tf_checkpoint/vocab-enwiki-news-500000.txt", "vocab"),
        ),
        source=f"{_ALLENNLP_SOURCE}; softmax and vocabulary: facebookresearch/LAMA download_models.sh",
    ),
    KnownModel(
        name="elmo-pubmed",
        language="en",
        description="PubMed (biomedical) ELMo, 2x4096_512_2048cnn_2xhighway, contributed by Matthew Peters",
        publisher="AllenNLP (contributed)",
        files=_pair(
            _S3 + "contributed/pubmed/elmo_2x4096_512_2048cnn_2xhighway_options.json",
            _S3 + "contributed/pubmed/elmo_2x4096_512_2048cnn_2xhighway_weights_PubMed_only.hdf5",
        ),
        source=_ALLENNLP_SOURCE,
        dims=1024,
        aliases=("pubmed",),
    ),
    KnownModel(
        name="elmo-pt-wikipedia",
        language="pt",
        description="Portuguese ELMo trained on Wikipedia, Federal University of Goiás (UFG)",
        publisher="AllenNLP (contributed)",
        files=_pair(
            _S3 + "contributed/pt/wikipedia/options.json",
            _S3 + "contributed/pt/wikipedia/elmo_pt_weights.hdf5",
        ),
        source=_ALLENNLP_SOURCE,
        aliases=("pt", "portuguese"),
    ),
    KnownModel(
        name="elmo-pt-brwac",
        language="pt",
        description="Portuguese ELMo trained on the brWaC corpus, Federal University of Goiás (UFG)",
        publisher="AllenNLP (contributed)",
        files=_pair(
            _S3 + "contributed/pt/brwac/options.json", _S3 + "contributed/pt/brwac/elmo_pt_weights_dgx1.hdf5"
        ),
        source=_ALLENNLP_SOURCE,
    ),
    KnownModel(
        name="elmo-ja",
        language="ja",
        description="Japanese ELMo, ExaWizards Inc. (Bataa and Wu, ACL 2019)",
        publisher="ExaWizards",
        files=_pair(
            "https://exawizardsallenlp.blob.core.windows.net/data/options.json",
            "https://exawizardsallenlp.blob.core.windows.net/data/weights.hdf5",
        ),
        source=_ALLENNLP_SOURCE,
        aliases=("japanese",),
    ),
)

_TSYSTEMS = "https://github.com/t-systems-on-site-services-gmbh/german-elmo-model/releases/download/files_1/"
_CLARIN_SI = "https://www.clarin.si/repository/xmlui/bitstream/handle/11356/1277/"
CONTRIBUTED = (
    KnownModel(
        name="elmo-de-tsystems",
        language="de",
        description="German ELMo on T-Systems' German Wikipedia text corpus (articles and talk pages), "
        "bilm-tf, 800,000-word vocabulary",
        publisher="T-Systems on site services",
        files=_pair(
            _TSYSTEMS + "options.json",
            _TSYSTEMS + "weights.hdf5",
            options_md5="da99676f2fe2838ff2663a6d9bad97dd",
            weights_md5="f3ab3a68caae6d42bac47c230b3a65bf",
        ),
        source="t-systems-on-site-services-gmbh/german-elmo-model README and LICENSE",
        licence="BSD-2-Clause",
        aliases=("german-elmo",),
    ),
    KnownModel(
        name="embeddia-sl",
        language="sl",
        description="EMBEDDIA Slovenian ELMo (Ulčar and Robnik-Šikonja, 2020), CLARIN.SI",
        publisher="EMBEDDIA (CLARIN.SI)",
        files=(RemoteFile(_CLARIN_SI + "slovenian-elmo.tar.gz", "archive"),),
        source="http://hdl.handle.net/11356/1277; the archive's name as public code downloads it",
        aliases=("slovenian-elmo",),
    ),
)

_NLPL = "http://vectors.nlpl.eu/repository/20/{}.zip"
_NORELMO = "https://wiki.nlpl.eu/Vectors/norlm/norelmo"
_SEMEVAL = "akutuzov/semeval2020 README (models of UiO-UvA at SemEval-2020 Task 1)"
_RUSVECTORES = "RusVectores name and NLPL ID as public download scripts use them (catalogue not checked)"


def _nlpl(
    number: int,
    language: str,
    description: str,
    source: str,
    aliases: tuple[str, ...] = (),
    lemmatized: bool = False,
) -> KnownModel:
    return KnownModel(
        name=f"nlpl-{number}",
        language=language,
        description=description,
        publisher="NLPL",
        files=(RemoteFile(_NLPL.format(number), "archive"),),
        source=source,
        aliases=aliases,
        lemmatized=lemmatized,
    )


NLPL = (
    _nlpl(209, "en", "English ELMo (NLPL ID 209)", _SEMEVAL),
    _nlpl(201, "de", "German ELMo (NLPL ID 201)", _SEMEVAL),
    _nlpl(202, "sv", "Swedish ELMo (NLPL ID 202)", _SEMEVAL),
    _nlpl(203, "la", "Latin ELMo (NLPL ID 203)", _SEMEVAL),
    _nlpl(
        210,
        "no",
        "NorELMo: lemmatized Norwegian Wikipedia (Sept. 2020, ~160M words)",
        _NORELMO,
        lemmatized=True,
    ),
    _nlpl(211, "no", "NorELMo: tokenized Norwegian Wikipedia (Sept. 2020, ~160M words)", _NORELMO),
    _nlpl(
        217, "no", "NorELMo30: Wikipedia + Norsk Aviskorpus, 30k-word vocabulary", _NORELMO, ("norelmo30",)
    ),
    _nlpl(
        218, "no", "NorELMo100: Wikipedia + Norsk Aviskorpus, 100k-word vocabulary", _NORELMO, ("norelmo100",)
    ),
    _nlpl(195, "ru", "RusVectores ruwikiruscorpora_tokens_elmo_1024_2019 (Wikipedia+RNC)", _RUSVECTORES),
    _nlpl(
        196,
        "ru",
        "RusVectores ruwikiruscorpora_lemmas_elmo_1024_2019 (Wikipedia+RNC)",
        _RUSVECTORES,
        lemmatized=True,
    ),
    _nlpl(
        199,
        "ru",
        "Russian ELMo on the Taiga corpus, lemmatized (NLPL ID 199)",
        _RUSVECTORES,
        lemmatized=True,
    ),
    _nlpl(
        212,
        "ru",
        "RusVectores araneum_lemmas_elmo_2048_2020 (Araneum Russicum, lemmas)",
        _RUSVECTORES,
        lemmatized=True,
    ),
)

# (ISO 639 code, language, NLPL ID) of ELMoForManyLangs' Downloads table.
_MANYLANGS = (
    ("ar", "Arabic", 136), ("bg", "Bulgarian", 137), ("ca", "Catalan", 138), ("cs", "Czech", 139),
    ("cu", "Old Church Slavonic", 140), ("da", "Danish", 141), ("de", "German", 142),
    ("el", "Greek", 143), ("en", "English", 144), ("es", "Spanish", 145), ("et", "Estonian", 146),
    ("eu", "Basque", 147), ("fa", "Persian", 148), ("fi", "Finnish", 149), ("fr", "French", 150),
    ("ga", "Irish", 151), ("gl", "Galician", 152), ("grc", "Ancient Greek", 153),
    ("he", "Hebrew", 154), ("hi", "Hindi", 155), ("hr", "Croatian", 156), ("hu", "Hungarian", 157),
    ("id", "Indonesian", 158), ("it", "Italian", 159), ("ja", "Japanese", 160),
    ("ko", "Korean", 161), ("la", "Latin", 162), ("lv", "Latvian", 163), ("nl", "Dutch", 164),
    ("nb", "Norwegian Bokmål", 165), ("nn", "Norwegian Nynorsk", 166), ("pl", "Polish", 167),
    ("pt", "Portuguese", 168), ("ro", "Romanian", 169), ("ru", "Russian", 170),
    ("sk", "Slovak", 171), ("sl", "Slovene", 172), ("sv", "Swedish", 173), ("tr", "Turkish", 174),
    ("ug", "Uyghur", 175), ("uk", "Ukrainian", 176), ("ur", "Urdu", 177),
    ("vi", "Vietnamese", 178), ("zh", "Chinese (traditional)", 179),
)  # fmt: skip
MANYLANGS = tuple(
    KnownModel(
        name=f"efml-{code}",
        language=code,
        description=f"ELMoForManyLangs {language} (CoNLL 2018 shared task data, 20M words)",
        publisher="HIT-SCIR (at NLPL)",
        files=(RemoteFile(f"http://vectors.nlpl.eu/repository/11/{number}.zip", "archive"),),
        source="HIT-SCIR/ELMoForManyLangs README, Downloads table",
        dims=1024,
        format="manylangs",
        aliases=(f"nlpl-{number}",),
    )
    for code, language, number in _MANYLANGS
)

_SEQVEC_BE = "http://data.bioembeddings.com/public/embeddings/embedding_models/seqvec/"
_SEQVEC_ROSTLAB = "https://rostlab.org/~deepppi/embedding_repo/embedding_models/seqvec/"
EFML_ZHS = KnownModel(
    name="efml-zhs",
    language="zh",
    description="ELMoForManyLangs simplified Chinese (Xinhua part of Chinese Gigaword v5)",
    publisher="HIT-SCIR",
    files=(RemoteFile("http://39.96.43.154/zhs.model.tar.bz2", "archive"),),
    source="HIT-SCIR/ELMoForManyLangs README, ELMo for Simplified Chinese",
    dims=1024,
    format="manylangs",
    aliases=("zhs",),
)

SEQVEC = (
    KnownModel(
        name="seqvec",
        language="protein",
        description="SeqVec: ELMo on UniRef50 protein sequences (a token per residue), bio_embeddings' files",
        publisher="Rostlab/bio_embeddings",
        files=_pair(_SEQVEC_BE + "options.json", _SEQVEC_BE + "weights.hdf5"),
        source="sacdallago/bio_embeddings bio_embeddings/utilities/defaults.yml (seqvec)",
        dims=1024,
    ),
    KnownModel(
        name="seqvec-uniref50-v2",
        language="protein",
        description="SeqVec as its README publishes it: seqvec.zip with the folder uniref50_v2",
        publisher="Rostlab",
        files=(RemoteFile("https://rostlab.org/~deepppi/seqvec.zip", "archive"),),
        source="mheinzinger/SeqVec README (Model availability)",
        dims=1024,
    ),
    KnownModel(
        name="seqvec-rostlab",
        language="protein",
        description="SeqVec's files at rostlab.org, with the md5 sums of its kipoi model card",
        publisher="Rostlab",
        files=_pair(
            _SEQVEC_ROSTLAB + "options.json",
            _SEQVEC_ROSTLAB + "weights.hdf5",
            options_md5="cede355187778de3ac302a83c761f5f9",
            weights_md5="0249d59249a50b43b79f641ff2ba7e88",
        ),
        source="kipoi/models SeqVec/embedding/model.yaml",
        dims=1024,
    ),
)

KNOWN_MODELS: tuple[KnownModel, ...] = (*ALLENNLP, *CONTRIBUTED, *NLPL, *SEQVEC, *MANYLANGS, EFML_ZHS)


def known_models() -> tuple[KnownModel, ...]:
    """Every model elmokit knows by name."""
    return KNOWN_MODELS


def find(name: str) -> KnownModel | None:
    """The known model called ``name`` or one of its aliases (case does not matter), or None."""
    key = name.strip().lower()
    for model in KNOWN_MODELS:
        if key == model.name or key in model.aliases:
            return model
    return None


def model_rows() -> list[dict[str, Any]]:
    """One dict per model, shipped ones first: name, language, dims, size (bytes: on disk when
    cached, else the publisher's total where given, else None), publisher, licence, url,
    cached ("shipped", "yes", "no": of ``files``), format, description, source, aliases, files,
    lm_files (the published softmax and vocabulary, fetched for scoring)."""
    rows: list[dict[str, Any]] = []
    for name in available_models():
        folder = MODELS_DIR / name
        rows.append(
            {
                "name": name,
                "language": "en",
                "dims": _shipped_dims(folder / "options.json"),
                "size": sum(p.stat().st_size for p in folder.iterdir() if p.is_file()),
                "publisher": "elmokit (shipped)",
                "licence": None,
                "url": None,
                "cached": "shipped",
                "format": "bilm",
                "description": f"shipped with elmokit; see {name}/README.md in the package",
                "source": "this package",
                "aliases": [],
                "files": [],
                "lm_files": [],
            }
        )
    for model in KNOWN_MODELS:
        cached = all(is_cached(f.url) for f in model.files)
        if cached:
            size: int | None = sum(int((read_meta(f.url) or {}).get("size", 0)) for f in model.files)
        elif all(f.size is not None for f in model.files):
            size = sum(f.size for f in model.files)  # type: ignore[misc]
        else:
            size = None
        rows.append(
            {
                "name": model.name,
                "language": model.language,
                "dims": model.dims,
                "size": size,
                "publisher": model.publisher,
                "licence": model.licence,
                "url": model.url,
                "cached": "yes" if cached else "no",
                "format": model.format,
                "description": model.description,
                "source": model.source,
                "aliases": list(model.aliases),
                "files": [_file_row(f) for f in model.files],
                "lm_files": [_file_row(f) for f in model.lm_files],
            }
        )
    return rows


def _file_row(file: RemoteFile) -> dict[str, Any]:
    return {"role": file.role, "url": file.url, "size": file.size, "sha256": file.sha256, "md5": file.md5}


def _shipped_dims(options_file: Path) -> int:
    """The size of one layer's vectors of a shipped model (2 * projection_dim), read from its
    options.json (shipped with the package: trusted, checked by the tests)."""
    options = read_json(options_file)
    return 2 * int(options["lstm"]["projection_dim"])


def format_models(rows: list[dict[str, Any]]) -> str:
    """The rows of ``model_rows`` as a plain-text table (unknown fields shown as "-")."""
    columns = ("name", "language", "dims", "size", "publisher", "licence", "cached", "url")
    header = ("NAME", "LANG", "DIM", "SIZE", "PUBLISHER", "LICENCE", "CACHED", "URL")

    def cell(row: dict[str, Any], key: str) -> str:
        value = row[key]
        if value is None:
            return "-"
        if key == "size":
            return _human(value)
        return str(value)

    table = [header, *[tuple(cell(row, key) for key in columns) for row in rows]]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns) - 1)]
    lines = ["  ".join(f"{v:<{w}}" for v, w in zip(line, widths)) + "  " + line[-1] for line in table]
    return "\n".join(line.rstrip() for line in lines)


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "K", "M", "G"):
        if value < 1024 or unit == "G":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _check_unique() -> None:
    names = [n for m in KNOWN_MODELS for n in (m.name, *m.aliases)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:  # pragma: no cover - guards edits of the table above
        raise AssertionError(f"registry names used twice: {duplicates}")


_check_unique()
