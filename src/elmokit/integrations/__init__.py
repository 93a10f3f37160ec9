"""Integrations of elmokit with other libraries, each in its own module, imported on demand:

- ``elmokit.integrations.flair``: ``ELMoEmbeddings``, flair token embeddings computed by elmokit
  (needs ``pip install 'elmokit[flair]'``).
- ``elmokit.integrations.ray``: ``EmbedBatches`` for Ray Data's ``map_batches``, and the engine of
  ``elmokit embed --engine ray`` (needs ``pip install 'elmokit[ray]'``).
"""

__all__: list[str] = []
