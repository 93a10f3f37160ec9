"""Getting a model: a spec (a shipped or known model's name, a model folder, an NLPL .zip, an
http(s) URL, ``hf://owner/name[@revision]``) -> its local files, through one resolver and one
cache folder. The hub reads no model: building one is ``BiLM.from_pretrained``'s part.

Modules: ``cache`` (the cache folder, offline mode), ``transport`` (plain URLs: ``fetch``, over
``entries``, the cache entry of a URL, ``http_client``, the transfer, and ``file_kinds``, what
kind of file a download must be), ``hf`` (the Hugging Face Hub), ``archives`` (.zip checked and
unpacked), ``registry`` (the known models, as data), ``shipped`` (the models in the package, the
default model), ``resolve`` (the resolver), ``datasets`` (a data set's name -> its verified local
files, as a spec is for a model).
"""

from .archives import ArchiveError
from .cache import ENV_CACHE, ENV_OFFLINE, cache_dir, offline
from .entries import ChecksumError, DownloadError, OfflineError, is_url
from .hf import is_hf_spec
from .registry import KnownModel, find, known_models
from .resolve import (
    ModelSource,
    download_model,
    is_manylangs_folder,
    is_tfhub_folder,
    model_files,
    resolve_file,
    resolve_model,
)
from .shipped import (
    DEFAULT_MODEL,
    MODELS_DIR,
    NEWS_MODEL,
    PACKAGE_DIR,
    TINY_REFERENCE,
    available_models,
    refuse_package_path,
)

__all__ = [
    "DEFAULT_MODEL",
    "ENV_CACHE",
    "ENV_OFFLINE",
    "MODELS_DIR",
    "NEWS_MODEL",
    "PACKAGE_DIR",
    "TINY_REFERENCE",
    "ArchiveError",
    "ChecksumError",
    "DownloadError",
    "KnownModel",
    "ModelSource",
    "OfflineError",
    "available_models",
    "cache_dir",
    "download_model",
    "find",
    "is_hf_spec",
    "is_manylangs_folder",
    "is_tfhub_folder",
    "is_url",
    "known_models",
    "model_files",
    "offline",
    "refuse_package_path",
    "resolve_file",
    "resolve_model",
]
