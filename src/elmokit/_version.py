"""elmokit's version, in a module of its own so that any layer can read it without importing
the package's front door."""

__all__ = ["__version__"]

__version__ = "0.1.0"
