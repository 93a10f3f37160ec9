"""Compatibility with code written for other ELMo implementations.

- ``elmokit.compat.allennlp``: AllenNLP 0.9's ELMo names and stateful behaviour (``Elmo``,
  ``ElmoEmbedder``, ``batch_to_ids``); switching is one import.
- ``install_allennlp_modules()``: for code you cannot edit (flair's ``ELMoEmbeddings``,
  bio_embeddings' ``SeqVecEmbedder``), make ``import allennlp.commands.elmo`` and
  ``import allennlp.modules.elmo`` give those names from elmokit. Opt-in, in memory only (an
  import hook; nothing is written to disk), and refused when a real allennlp is importable,
  then or later (a plain folder named ``allennlp``, without ``__init__.py``, is not one).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

from .files import resolve_model_file

__all__ = [
    "ALLENNLP_MODULES",
    "AllenNLPConflictError",
    "install_allennlp_modules",
    "resolve_model_file",
    "uninstall_allennlp_modules",
]

# The packages and the two ELMo modules that install_allennlp_modules() provides.
_PACKAGES = ("allennlp", "allennlp.commands", "allennlp.modules")
_ELMO_MODULES = {
    "allennlp.modules.elmo": "MODULES_ELMO_NAMES",
    "allennlp.commands.elmo": "COMMANDS_ELMO_NAMES",
}
ALLENNLP_MODULES = (*_PACKAGES, *_ELMO_MODULES)


class AllenNLPConflictError(ImportError):
    """A real allennlp is importable, so elmokit will not stand in for it."""


class _AllenNLPModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves exactly ``ALLENNLP_MODULES`` from elmokit; any other ``allennlp.*`` is not found
    (``importlib.util.find_spec`` gives None, an import ModuleNotFoundError), and a real
    allennlp that became importable after the install is refused, never shadowed."""

    def find_spec(self, fullname: str, path=None, target=None):  # noqa: ANN001
        if fullname == "allennlp":
            _refuse_real_allennlp()
        if fullname in _PACKAGES:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        if fullname in _ELMO_MODULES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # a fresh module, filled by exec_module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__elmokit_compat__ = True  # type: ignore[attr-defined]
        if module.__name__ in _ELMO_MODULES:
            from . import allennlp as compat

            module.__doc__ = f"{module.__name__} from elmokit.compat.allennlp (AllenNLP 0.9's names)."
            for name in getattr(compat, _ELMO_MODULES[module.__name__]):
                setattr(module, name, getattr(compat, name))
        else:
            module.__doc__ = f"elmokit's stand-in for {module.__name__}: only its ELMo modules exist."


_FINDER = _AllenNLPModules()


def _real_allennlp() -> importlib.machinery.ModuleSpec | None:
    """The spec of the allennlp that Python would import without elmokit's hook: a package or a
    module with a file. A plain folder named ``allennlp`` (a namespace package, e.g. of data)
    is not one."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if finder is _FINDER or find is None:
            continue
        try:
            spec = find("allennlp", None)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.origin not in (None, "namespace"):
            return spec
    return None


def _refuse_real_allennlp() -> None:
    """Raise AllenNLPConflictError if a real allennlp is importable."""
    spec = _real_allennlp()
    if spec is not None:
        raise AllenNLPConflictError(
            f"a real allennlp is importable ({spec.origin}); elmokit will not shadow it: use it, or "
            "uninstall it (pip uninstall allennlp) to run this code on elmokit"
        )


def install_allennlp_modules() -> None:
    """Make ``allennlp.commands.elmo`` and ``allennlp.modules.elmo`` (and their packages
    ``allennlp``, ``allennlp.commands``, ``allennlp.modules``) importable, holding
    ``elmokit.compat.allennlp``'s ``ElmoEmbedder``, ``Elmo``, ``batch_to_ids``,
    ``DEFAULT_OPTIONS_FILE`` ... so that packages importing them run on elmokit unchanged.
    Other ``allennlp.*`` modules do not exist (``importlib.util.find_spec`` gives None).

    Call it before importing such a package's ELMo code. It installs an import hook for this
    process only (nothing is written to disk); calling it again does nothing. Raises
    ``AllenNLPConflictError`` when a real allennlp is importable or already imported (and
    ``import allennlp`` raises it when a real one became importable later, e.g. through
    ``sys.path``)."""
    if _FINDER in sys.meta_path:
        return
    loaded = sys.modules.get("allennlp")
    if loaded is not None and not getattr(loaded, "__elmokit_compat__", False):
        where = getattr(loaded, "__file__", None) or "an allennlp module"
        raise AllenNLPConflictError(
            f"allennlp is already imported ({where}); elmokit will not stand in for a real allennlp"
        )
    if loaded is None:
        _refuse_real_allennlp()
    sys.meta_path.insert(0, _FINDER)


def uninstall_allennlp_modules() -> None:
    """Undo ``install_allennlp_modules()``: remove the hook and the modules it made (objects
    already created from them keep working: their classes live in ``elmokit.compat.allennlp``)."""
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n in sys.modules if n == "allennlp" or n.startswith("allennlp.")]:
        if getattr(sys.modules[name], "__elmokit_compat__", False):
            del sys.modules[name]
