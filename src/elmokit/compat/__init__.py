"""Compatibility with code written for other ELMo implementations.

- ``elmokit.compat.allennlp``: AllenNLP 0.9's ELMo names and stateful behaviour (``Elmo``,
  ``ElmoEmbedder``, ``batch_to_ids``); switching is one import.
- ``install_allennlp_modules()``: for code you cannot edit (flair's ``ELMoEmbeddings``,
  bio_embeddings' ``SeqVecEmbedder``), make ``import allennlp.commands.elmo`` and
  ``import allennlp.modules.elmo`` give those names from elmokit. Opt-in, in memory only (an
  import hook; nothing is written to disk), and refused when a real allennlp is importable,
  then or later (a plain folder named ``allennlp``, without ``__init__.py``, is not one).
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
    "PackageConflictError",
    "install_allennlp_modules",
    "install_simple_elmo_module",
    "resolve_model_file",
    "uninstall_allennlp_modules",
    "uninstall_simple_elmo_module",
]

# What install_allennlp_modules() provides: each module (True: a package) and the attribute of
# elmokit.compat.allennlp listing the names it holds (None: only its submodules).
_TABLES: dict[str, dict[str, tuple[bool, str | None]]] = {
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


class PackageConflictError(ImportError):
    """A real package of the name elmokit would stand in for is importable."""


class AllenNLPConflictError(PackageConflictError):
    """A real allennlp is importable, so elmokit will not stand in for it."""


class SimpleElmoConflictError(PackageConflictError):
    """A real simple_elmo is importable, so elmokit will not stand in for it."""


class _CompatModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves exactly the modules of one table of ``_TABLES`` (``root`` and below) from
    ``elmokit.compat.<root>``; any other ``<root>.*`` is not found (``importlib.util.find_spec``
    gives None, an import ModuleNotFoundError), and a real ``root`` package that became
    importable after the install is refused, never shadowed."""

    def __init__(self, root: str, conflict: type[PackageConflictError]) -> None:
        self.root = root
        self.conflict = conflict
        self.table = _TABLES[root]

    def find_spec(self, fullname: str, path=None, target=None):  # noqa: ANN001
        if fullname == self.root:
            self.refuse_real_package()
        if fullname in self.table:
            return importlib.util.spec_from_loader(fullname, self, is_package=self.table[fullname][0])
        return None

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

    def real_package(self) -> importlib.machinery.ModuleSpec | None:
        """The spec of the ``root`` package Python would import without this hook: a package or
        a module with a file. A plain folder of that name (a namespace package, e.g. of data) is
        not one."""
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if isinstance(finder, _CompatModules) or find is None:
                continue
            try:
                spec = find(self.root, None)
            except (ImportError, ValueError):
                continue
            if spec is not None and spec.origin not in (None, "namespace"):
                return spec
        return None

    def refuse_real_package(self) -> None:
        """Raise ``self.conflict`` if a real ``root`` package is importable."""
        spec = self.real_package()
        if spec is not None:
            raise self.conflict(
                f"a real {self.root} is importable ({spec.origin}); elmokit will not shadow it: use "
                f"it, or uninstall it (pip uninstall {self.root}) to run this code on elmokit"
            )

    def install(self) -> None:
        """Put the hook first on ``sys.meta_path`` (nothing if it is there already), unless a
        real ``root`` package is importable or imported."""
        if self in sys.meta_path:
            return
        loaded = sys.modules.get(self.root)
        if loaded is not None and not getattr(loaded, "__elmokit_compat__", False):
            where = getattr(loaded, "__file__", None) or f"a {self.root} module"
            raise self.conflict(
                f"{self.root} is already imported ({where}); elmokit will not stand in for a real {self.root}"
            )
        if loaded is None:
            self.refuse_real_package()
        sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        """Remove the hook and the modules it made."""
        while self in sys.meta_path:
            sys.meta_path.remove(self)
        for name in [n for n in sys.modules if n == self.root or n.startswith(self.root + ".")]:
            if getattr(sys.modules[name], "__elmokit_compat__", False):
                del sys.modules[name]


_FINDER = _CompatModules("allennlp", AllenNLPConflictError)
_SIMPLE_ELMO_FINDER = _CompatModules("simple_elmo", SimpleElmoConflictError)


def install_allennlp_modules() -> None:
    """Make ``allennlp.commands.elmo`` and ``allennlp.modules.elmo`` (and the other modules of
    ``ALLENNLP_MODULES``) importable, holding ``elmokit.compat.allennlp``'s ``ElmoEmbedder``,
    ``Elmo``, ``batch_to_ids``, ``DEFAULT_OPTIONS_FILE`` ... so that packages importing them run
    on elmokit unchanged. Other ``allennlp.*`` modules do not exist (``importlib.util.find_spec``
    gives None).

    Call it before importing such a package's ELMo code. It installs an import hook for this
    process only (nothing is written to disk); calling it again does nothing. Raises
    ``AllenNLPConflictError`` when a real allennlp is importable or already imported (and
    ``import allennlp`` raises it when a real one became importable later, e.g. through
    ``sys.path``)."""
    _FINDER.install()


def uninstall_allennlp_modules() -> None:
    """Undo ``install_allennlp_modules()``: remove the hook and the modules it made (objects
    already created from them keep working: their classes live in ``elmokit.compat.allennlp``)."""
    _FINDER.uninstall()


def install_simple_elmo_module() -> None:
    """Make ``import simple_elmo`` (and ``simple_elmo.elmo_helpers``) give
    ``elmokit.compat.simple_elmo``'s ``ElmoModel`` and ``divide_chunks``, so that code written
    for simple_elmo runs on elmokit unchanged.

    Call it before the code imports simple_elmo. An import hook for this process only (nothing
    is written to disk); calling it again does nothing. Raises ``SimpleElmoConflictError`` when a
    real simple_elmo is importable or already imported (or becomes importable later)."""
    _SIMPLE_ELMO_FINDER.install()


def uninstall_simple_elmo_module() -> None:
    """Undo ``install_simple_elmo_module()``: remove the hook and the modules it made."""
    _SIMPLE_ELMO_FINDER.uninstall()
