"""Compatibility with code written for other ELMo implementations.

- ``elmokit.compat.allennlp``: AllenNLP 0.9's ELMo names and stateful behaviour (``Elmo``,
  ``ElmoEmbedder``, ``batch_to_ids``); switching is one import.
- ``install_allennlp_modules()``: for code you cannot edit (flair's ``ELMoEmbeddings``,
  bio_embeddings' ``SeqVecEmbedder``), make ``import allennlp.commands.elmo`` and
  ``import allennlp.modules.elmo`` give those names from elmokit. Opt-in, in memory only (an
  import hook; nothing is written to disk), and refused when a real allennlp is importable.
  Besides the ELMo modules: ``allennlp.modules`` (``Elmo``, ``ScalarMix``),
  ``allennlp.modules.token_embedders`` (``ElmoTokenEmbedder``), ``allennlp.data.token_indexers``
  (``ELMoTokenCharactersIndexer``, ``ELMoCharacterMapper``) and ``allennlp.nn.util``'s sentence
  boundary functions.
- ``elmokit.compat.simple_elmo``: simple_elmo 0.9.2's ``ElmoModel`` (NLPL's loader);
  ``install_simple_elmo_module()`` makes ``import simple_elmo`` give it, on the same terms.
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
    "SIMPLE_ELMO_MODULES",
    "AllenNLPConflictError",
    "SimpleElmoConflictError",
    "install_allennlp_modules",
    "install_simple_elmo_module",
    "resolve_model_file",
    "uninstall_allennlp_modules",
    "uninstall_simple_elmo_module",
]

# What install_allennlp_modules() provides: each module (True: a package) and the attribute of
# elmokit.compat.allennlp listing the names it holds (None: only its submodules).
_TABLES = {
    "allennlp": {
        "allennlp": (True, None),
        "allennlp.commands": (True, None),
        "allennlp.commands.elmo": (False, "COMMANDS_ELMO_NAMES"),
        "allennlp.modules": (True, "MODULES_NAMES"),
        "allennlp.modules.elmo": (False, "MODULES_ELMO_NAMES"),
        "allennlp.modules.scalar_mix": (False, "SCALAR_MIX_NAMES"),
        "allennlp.modules.token_embedders": (True, "TOKEN_EMBEDDERS_NAMES"),
        "allennlp.modules.token_embedders.elmo_token_embedder": (False, "TOKEN_EMBEDDERS_NAMES"),
        "allennlp.data": (True, None),
        "allennlp.data.token_indexers": (True, "TOKEN_INDEXERS_NAMES"),
        "allennlp.data.token_indexers.elmo_indexer": (False, "ELMO_INDEXER_NAMES"),
        "allennlp.nn": (True, None),
        "allennlp.nn.util": (False, "NN_UTIL_NAMES"),
    },
    # What install_simple_elmo_module() provides, from elmokit.compat.simple_elmo.
    "simple_elmo": {
        "simple_elmo": (True, "SIMPLE_ELMO_NAMES"),
        "simple_elmo.elmo_helpers": (False, "SIMPLE_ELMO_NAMES"),
    },
}
ALLENNLP_MODULES = tuple(_TABLES["allennlp"])
SIMPLE_ELMO_MODULES = tuple(_TABLES["simple_elmo"])


class AllenNLPConflictError(ImportError):
    """A real allennlp is importable, so elmokit will not stand in for it."""


class SimpleElmoConflictError(ImportError):
    """A real simple_elmo is importable, so elmokit will not stand in for it."""


class _CompatModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves exactly the modules of one table of ``_TABLES`` (``root`` and below) from
    ``elmokit.compat.<root>``; any other ``<root>.*`` import fails with a message naming what is
    provided."""

    def __init__(self, root: str, installer: str) -> None:
        self.root = root
        self.installer = installer
        self.table = _TABLES[root]

    def find_spec(self, fullname: str, path=None, target=None):  # noqa: ANN001
        if fullname != self.root and not fullname.startswith(self.root + "."):
            return None
        if fullname in self.table:
            return importlib.util.spec_from_loader(fullname, self, is_package=self.table[fullname][0])
        provided = [name for name, (package, names) in self.table.items() if names is not None]
        raise ModuleNotFoundError(
            f"No module named {fullname!r}: elmokit's {self.root} compatibility provides only "
            f"{', '.join(provided)} (elmokit.compat.{self.installer})",
            name=fullname,
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # a fresh module, filled by exec_module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__elmokit_compat__ = True  # type: ignore[attr-defined]
        names = self.table[module.__name__][1]
        if names is None:
            module.__doc__ = f"elmokit's stand-in for {module.__name__}: only its ELMo modules exist."
            return
        compat = importlib.import_module(f"{__name__}.{self.root}")
        module.__doc__ = f"{module.__name__} from elmokit.compat.{self.root}."
        for name in getattr(compat, names):
            setattr(module, name, getattr(compat, name))


_FINDER = _CompatModules("allennlp", "install_allennlp_modules")
_SIMPLE_ELMO_FINDER = _CompatModules("simple_elmo", "install_simple_elmo_module")


def install_allennlp_modules() -> None:
    """Make ``allennlp.commands.elmo`` and ``allennlp.modules.elmo`` (and their packages
    ``allennlp``, ``allennlp.commands``, ``allennlp.modules``) importable, holding
    ``elmokit.compat.allennlp``'s ``ElmoEmbedder``, ``Elmo``, ``batch_to_ids``,
    ``DEFAULT_OPTIONS_FILE`` ... so that packages importing them run on elmokit unchanged.

    Call it before importing such a package's ELMo code. It installs an import hook for this
    process only (nothing is written to disk); calling it again does nothing. Raises
    ``AllenNLPConflictError`` when a real allennlp is importable or already imported."""
    if _FINDER in sys.meta_path:
        return
    loaded = sys.modules.get("allennlp")
    if loaded is not None and not getattr(loaded, "__elmokit_compat__", False):
        where = getattr(loaded, "__file__", None) or "an allennlp module"
        raise AllenNLPConflictError(
            f"allennlp is already imported ({where}); elmokit will not stand in for a real allennlp"
        )
    spec = importlib.util.find_spec("allennlp") if loaded is None else None
    if spec is not None:
        where = spec.origin or ", ".join(spec.submodule_search_locations or []) or "sys.path"
        raise AllenNLPConflictError(
            f"a real allennlp is importable ({where}); elmokit will not shadow it: use it, or "
            "uninstall it (pip uninstall allennlp) to run this code on elmokit"
        )
    sys.meta_path.insert(0, _FINDER)


def uninstall_allennlp_modules() -> None:
    """Undo ``install_allennlp_modules()``: remove the hook and the modules it made (objects
    already created from them keep working: their classes live in ``elmokit.compat.allennlp``)."""
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n in sys.modules if n == "allennlp" or n.startswith("allennlp.")]:
        if getattr(sys.modules[name], "__elmokit_compat__", False):
            del sys.modules[name]


def install_simple_elmo_module() -> None:
    """Make ``import simple_elmo`` (and ``simple_elmo.elmo_helpers``) give
    ``elmokit.compat.simple_elmo``'s ``ElmoModel`` and ``divide_chunks``, so that code written
    for simple_elmo runs on elmokit unchanged.

    Call it before the code imports simple_elmo. An import hook for this process only (nothing
    is written to disk); calling it again does nothing. Raises ``SimpleElmoConflictError`` when a
    real simple_elmo is importable or already imported."""
    if _SIMPLE_ELMO_FINDER in sys.meta_path:
        return
    loaded = sys.modules.get("simple_elmo")
    if loaded is not None and not getattr(loaded, "__elmokit_compat__", False):
        where = getattr(loaded, "__file__", None) or "a simple_elmo module"
        raise SimpleElmoConflictError(
            f"simple_elmo is already imported ({where}); elmokit will not stand in for a real simple_elmo"
        )
    spec = importlib.util.find_spec("simple_elmo") if loaded is None else None
    if spec is not None:
        where = spec.origin or ", ".join(spec.submodule_search_locations or []) or "sys.path"
        raise SimpleElmoConflictError(
            f"a real simple_elmo is importable ({where}); elmokit will not shadow it: use it, or "
            "uninstall it (pip uninstall simple_elmo) to run this code on elmokit"
        )
    sys.meta_path.insert(0, _SIMPLE_ELMO_FINDER)


def uninstall_simple_elmo_module() -> None:
    """Undo ``install_simple_elmo_module()``: remove the hook and the modules it made."""
    while _SIMPLE_ELMO_FINDER in sys.meta_path:
        sys.meta_path.remove(_SIMPLE_ELMO_FINDER)
    for name in [n for n in sys.modules if n == "simple_elmo" or n.startswith("simple_elmo.")]:
        if getattr(sys.modules[name], "__elmokit_compat__", False):
            del sys.modules[name]
