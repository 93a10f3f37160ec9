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

from .cache import cache_dir
from .entries import DownloadError
from .resolve import ModelSource, download_model, model_files, resolve_model
from .shipped import DEFAULT_MODEL

__all__ = [
    "DEFAULT_MODEL",
    "DownloadError",
    "ModelSource",
    "cache_dir",
    "download_model",
    "model_files",
    "resolve_model",
]
