"""Training the biLM: the run's configuration (``elmokit.training.config``: ``TrainConfig``,
``resume_config``, ``prepare_run``), the loop each process runs (``elmokit.training.loop``:
``train``, ``Trainer``) and the launcher of the command line (``elmokit.training.launch``, which
nothing in the library imports). Import each name from the module that defines it."""

__all__: list[str] = []
