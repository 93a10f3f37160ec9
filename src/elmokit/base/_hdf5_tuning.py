"""libhdf5 tuning for long embedding runs, in one place and switchable: the kernel name
``hdf5_free_lists`` of ``elmokit.base.kernels`` (on by default; ``ELMOKIT_KERNELS=-hdf5_free_lists`` or
``kernels.disabled("hdf5_free_lists")`` leaves HDF5's own settings alone).

Why by hand: h5py does not wrap ``H5set_free_list_limits``, so the call is made through ctypes on
the HDF5 library that h5py loaded, found in the process's memory map (Linux; elsewhere, or if the
library is not found, nothing changes).
"""

from __future__ import annotations

import ctypes
import logging

from . import kernels

__all__ = ["apply"]

logger = logging.getLogger(__name__)


def apply() -> bool:
    """Make HDF5 hand the blocks it frees back to malloc (``H5set_free_list_limits`` of 0)
    instead of keeping them on its own free lists, when the kernel ``hdf5_free_lists`` is on.
    Kept blocks of the many sizes an embedding run writes pinned the heap between torch's
    per-batch buffers: the peak RSS of ``embed`` grew by about 250 bytes per line.
    Process-wide and harmless to repeat. Returns whether the limits were set."""
    if not kernels.enabled("hdf5_free_lists"):
        return False
    return _limit_free_lists()


def _limit_free_lists() -> bool:
    """The ctypes call into every libhdf5 mapped into this process; whether one took it."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "/libhdf5" in line and "libhdf5_hl" not in line}
    except OSError:
        return False
    done = False
    for path in sorted(paths):
        try:
            function = ctypes.CDLL(path).H5set_free_list_limits
        except (OSError, AttributeError):
            continue
        function.argtypes, function.restype = [ctypes.c_int] * 6, ctypes.c_int
        done = function(0, 0, 0, 0, 0, 0) >= 0 or done
    if not done:
        logger.debug("no libhdf5 with H5set_free_list_limits found in this process's memory map")
    return done
