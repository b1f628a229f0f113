"""Name -> class registries that fill themselves from a package's modules.

A new positional scheme or scaling method is one module that decorates its
class with ``@REGISTRY.register("name")``; importing the package imports every
module in it, so nothing else has to be edited.
"""

import importlib
import pkgutil

from rope_lm.core.errors import ConfigError


class Registry:
    def __init__(self, kind: str, package: str, config_key: str):
        self.kind = kind
        self.package = package
        self.config_key = config_key
        self._entries: dict[str, type] = {}
        self._loaded = False

    def register(self, name: str):
        def decorate(cls):
            if name in self._entries and self._entries[name] is not cls:
                raise RuntimeError(f"{self.kind} {name!r} is registered twice")
            cls.name = name
            self._entries[name] = cls
            return cls

        return decorate

    def _load(self):
        if self._loaded:
            return
        self._loaded = True
        pkg = importlib.import_module(self.package)
        for info in pkgutil.iter_modules(pkg.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{self.package}.{info.name}")

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def get(self, name: str) -> type:
        self._load()
        if name not in self._entries:
            raise ConfigError(
                f"Unknown {self.kind} {name!r} (setting `{self.config_key}`). "
                f"Valid names are: {', '.join(self.names())}."
            )
        return self._entries[name]

    def build(self, options: dict | None, *args, default: str | None = None):
        """An instance from its settings ({name: ..., knob: value, ...}):
        `args` come first (e.g. a scheme's Dims); a knob the class does not
        take is a ConfigError naming the settings and their config file."""
        options = dict(options or {"name": default})
        name = options.pop("name", default)
        cls = self.get(name)
        try:
            return cls(*args, **options)
        except TypeError as e:
            group = self.config_key.split(".")[0]
            raise ConfigError(
                f"{self.kind[0].upper() + self.kind[1:]} {name!r} got an option it does not take ({e}). "
                f"Check the `{group}.*` settings against conf/{group}/{name}.yaml."
            ) from None
