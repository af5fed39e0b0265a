"""The import hook behind the shim: ``import accelerate.<path>`` gives the module object ``accel.<path>``.

One module object under two names (``sys.modules["accelerate.utils"] is sys.modules["accel.utils"]``), so a class
imported through either name is the same class, ``isinstance`` and ``mock.patch`` agree, and nothing is copied. The
aliased module is imported only when the alias is imported (``import accelerate`` alone imports neither torch nor
any accel module beyond ``accel`` itself). No torch import here.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType


class AliasLoader(importlib.abc.Loader):
    """Loads the alias by importing the real module and handing that same object to the import system."""

    def __init__(self, real_name: str) -> None:
        self.real_name = real_name
        self._real_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.real_name)
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamps the alias's spec on the module it was given (importlib's _init_module_attrs sets
        # __spec__ unconditionally); the module is accel's and keeps accel's spec (reload, pickling by module path).
        module.__spec__ = self._real_spec


class AliasFinder(importlib.abc.MetaPathFinder):
    """Answers ``<alias>.<path>`` with a spec whose loader returns the module ``<target>.<path>``."""

    def __init__(self, alias: str, target: str) -> None:
        self.alias = alias
        self.target = target

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(f"{self.alias}."):
            return None
        real_name = self.target + fullname[len(self.alias) :]
        real = sys.modules.get(real_name)
        try:
            real_spec = real.__spec__ if real is not None else importlib.util.find_spec(real_name)
        except ModuleNotFoundError:  # a parent of real_name is not a package: the alias does not exist either
            return None
        if real_spec is None:
            return None
        is_package = real_spec.submodule_search_locations is not None
        return importlib.util.spec_from_loader(fullname, AliasLoader(real_name), is_package=is_package)


def install(alias: str, target: str) -> AliasFinder:
    """Puts the finder for ``alias`` first on ``sys.meta_path`` (once: a reloaded shim does not add a second)."""
    for finder in sys.meta_path:
        if isinstance(finder, AliasFinder) and finder.alias == alias:
            return finder
    finder = AliasFinder(alias, target)
    sys.meta_path.insert(0, finder)
    return finder
