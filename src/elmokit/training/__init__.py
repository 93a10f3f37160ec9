"""Training the biLM: the corpus stream and its batches (``elmokit.training.data``), the run's
configuration (``elmokit.training.config``: ``TrainConfig``, ``resume_config``, ``prepare_run``),
the loop each process runs (``elmokit.training.loop``: ``train``, ``Trainer``), its collectives
(``elmokit.training.collectives``) and CSV logs (``elmokit.training.metrics``), held-out
perplexity (``elmokit.training.evaluate``), a trained checkpoint written as a model folder
(``elmokit.training.export``) and the launcher of the command line (``elmokit.training.launch``,
which nothing in the library imports). Import each name from the module that defines it."""

__all__: list[str] = []
