"""Models on the Hugging Face Hub: ``hf://owner/name[@revision]``, fetched with huggingface_hub
(the optional extra ``elmokit[hub]``) into elmokit's one cache folder (``<cache>/hf``).

The snapshot is then read like any model folder (``elmokit.hub.resolve``). ``revision`` is a
branch, a tag or a commit (default: the repository's ``main``). The endpoint is ``HF_ENDPOINT``
when set (read at each call, so a mirror or a test server can be named late), else the Hub's.
With ``ELMOKIT_OFFLINE=1`` only a snapshot already in the cache is used (``local_files_only``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .cache import ENV_OFFLINE, cache_dir, offline
from .entries import DownloadError, OfflineError

__all__: list[str] = []

HF_SCHEME = "hf://"
HF_FOLDER = "hf"  # the subfolder of the cache the snapshots go to
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_SPEC = re.compile(rf"(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[^\s@]+))?")
_INSTALL = "pip install 'elmokit[hub]'"


class HfSpec:
    """A parsed ``hf://owner/name[@revision]``: ``repo_id`` and ``revision`` (None: main)."""

    def __init__(self, repo_id: str, revision: str | None) -> None:
        self.repo_id, self.revision = repo_id, revision

    def __repr__(self) -> str:
        return f"HfSpec({self.repo_id!r}, {self.revision!r})"


def is_hf_spec(text: object) -> bool:
    """Whether ``text`` is a Hugging Face Hub spec (starts with ``hf://``)."""
    return isinstance(text, str) and text.startswith(HF_SCHEME)


def parse_hf_spec(text: str) -> HfSpec:
    """``hf://owner/name[@revision]`` -> HfSpec; a ValueError names a malformed spec."""
    match = _SPEC.fullmatch(text[len(HF_SCHEME) :]) if is_hf_spec(text) else None
    if match is None or ".." in match["repo"]:
        raise ValueError(f"{text!r} is not a Hugging Face Hub model: expected hf://owner/name[@revision]")
    return HfSpec(match["repo"], match["revision"])


def snapshot(text: str, *, force: bool = False) -> Path:
    """The local folder of the repository ``text`` names (downloaded into ``<cache>/hf`` unless
    cached; ``force``: downloaded again). Errors are one line: ImportError without
    huggingface_hub, OfflineError, DownloadError."""
    spec = parse_hf_spec(text)
    try:
        from huggingface_hub import snapshot_download  # the optional extra: imported on use
    except ImportError:
        raise ImportError(f"{text} needs huggingface_hub: {_INSTALL}") from None
    where = f"{spec.repo_id}" + (f"@{spec.revision}" if spec.revision else "")
    try:
        folder = snapshot_download(
            repo_id=spec.repo_id,
            revision=spec.revision,
            cache_dir=cache_dir() / HF_FOLDER,
            local_files_only=offline(),
            force_download=force,
            endpoint=os.environ.get("HF_ENDPOINT") or None,
        )
    except (OSError, ValueError) as err:  # huggingface_hub's errors derive from these
        cause = (str(err).strip().splitlines() or [type(err).__name__])[0]
        if offline():
            raise OfflineError(
                f"hf://{where} is not in the cache ({cache_dir() / HF_FOLDER}) and {ENV_OFFLINE}=1 "
                f"forbids downloading it: unset {ENV_OFFLINE}, or run `elmokit download hf://{where}` "
                "on a machine with a network"
            ) from None
        raise DownloadError(f"cannot download hf://{where} from the Hugging Face Hub: {cause}") from None
    return Path(folder)
