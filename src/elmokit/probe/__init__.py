"""What each biLM layer captures (the paper's section 5.3): ``run_probe``, a linear classifier per
layer on token labels (POS, chunks, NER, dependency relations), and ``run_wsd``, the 1-NN word
sense protocol per layer. ``elmokit probe`` and ``elmokit probe wsd`` are their command lines."""

from .tagging import (
    FORMATS,
    Features,
    LayerScores,
    ProbeResult,
    ProbeSettings,
    compute_features,
    parse_layers,
    probe_files,
    read_tagged,
    run_probe,
)
from .wsd import (
    Instance,
    WsdSentence,
    first_senses,
    gold_key_path,
    read_gold_keys,
    read_wsd_xml,
    run_wsd,
    wsd_files,
    wsd_table,
)

__all__ = [
    "FORMATS",
    "Features",
    "LayerScores",
    "ProbeResult",
    "ProbeSettings",
    "compute_features",
    "parse_layers",
    "probe_files",
    "read_tagged",
    "run_probe",
    "Instance",
    "WsdSentence",
    "first_senses",
    "gold_key_path",
    "read_gold_keys",
    "read_wsd_xml",
    "run_wsd",
    "wsd_files",
    "wsd_table",
]
