"""Downloads of plain URLs into elmokit's cache: one entry per URL, atomic, resumable, verified,
offline-aware. ``fetch`` is the one way in; it coordinates the modules of one idea each:

- ``elmokit.hub.entries``: the cache entry of a URL (its folder, meta.json, the lock) and the
  errors of a download;
- ``elmokit.hub.http_client``: the HTTP transfer (resume, bounds, one-line failures);
- ``elmokit.hub.file_kinds``: what kind of file a download must be.

Every failure is one line naming the URL and the cause: no network or unknown host, HTTP status,
a body cut short, a size or checksum other than the publisher's, a full disk. With
``ELMOKIT_OFFLINE=1`` nothing touches the network: a URL that is not cached is an error that
names it and says what to do.
"""

from __future__ import annotations

import errno
import sys
from dataclasses import replace
from pathlib import Path

from .cache import ENV_CACHE, ENV_OFFLINE, offline
from .entries import DownloadError, OfflineError, cached_file, entry_dir, entry_lock, normalize_url
from .file_kinds import Expected, url_kind
from .http_client import download

__all__: list[str] = []


def fetch(
    url: str,
    expected: Expected | None = None,
    *,
    force: bool = False,
    progress: bool | None = None,
    name: str | None = None,
) -> Path:
    """The local file of ``url``: from the cache, else downloaded into it (resumed if an earlier
    attempt was cut, verified against ``expected``). ``force`` downloads again even if cached.
    ``progress``: a progress bar on stderr (None: when stderr is a terminal). ``name``: the
    known model the file belongs to (for messages). Raises DownloadError (OfflineError,
    ChecksumError) with a one-line message."""
    url = normalize_url(url)
    expected = expected or Expected()
    if expected.kind is None:
        expected = replace(expected, kind=url_kind(url))
    if not force:
        hit = cached_file(url, expected, name)
        if hit is not None:
            return hit
    entry = entry_dir(url)
    if offline():
        raise OfflineError(
            f"{url} is not in the download cache and {ENV_OFFLINE}=1 forbids downloading it: unset "
            f"{ENV_OFFLINE} to download it, or run `elmokit download {name or url}` on a machine with a "
            f"network and copy the cache folder {entry} to the same place here"
        )
    if progress is None:
        progress = sys.stderr.isatty()
    try:
        entry.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DownloadError(
            f"cannot make the cache folder {entry} ({err.strerror or err}); set {ENV_CACHE} to a "
            "writable folder"
        ) from None
    with entry_lock(entry, url, progress):
        if not force:  # another process may have finished it while this one waited
            hit = cached_file(url, expected, name)
            if hit is not None:
                return hit
        try:
            return download(url, entry, expected, progress)
        except DownloadError:
            raise
        except OSError as err:  # the cache's disk: full, read-only, ...
            raise DownloadError(_disk_failure(url, entry, err)) from None


def _disk_failure(url: str, entry: Path, err: OSError) -> str:
    """One line: why the download of ``url`` could not be written into ``entry``."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"disk full: no space left in {entry} for {url}; free some space or set {ENV_CACHE} "
            "to a folder on a larger disk"
        )
    return f"cannot write the download of {url} into {entry}: {err.strerror or err}"
