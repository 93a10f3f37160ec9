"""The ``elmokit`` command line (front end): the parser and every command's handler
(``commands``), the data sets' command (``data``) and the app factory of each process of
``elmokit serve --workers N`` (``_serve_worker``). The library never imports this package."""

from __future__ import annotations

from .commands import main

__all__ = ["main"]
