"""The base layer: files, text, size bounds, devices, processes, signals and the fast-variant switches.
No model, no network; every other package may import it."""

__all__: list[str] = []
