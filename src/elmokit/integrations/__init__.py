"""Integrations of elmokit with other libraries, each in its own module, imported on demand:

- ``elmokit.integrations.flair``: ``ELMoEmbeddings``, flair token embeddings computed by elmokit
  (needs ``pip install 'elmokit[flair]'``).
"""
