"""What each biLM layer captures (the paper's section 5.3): ``run_probe``, a linear classifier per
layer on token labels (POS, chunks, NER, dependency relations), and ``run_wsd``, the 1-NN word
sense protocol per layer. ``elmokit probe`` and ``elmokit probe wsd`` are their command lines."""

from .tagging import ProbeResult, read_tagged, run_probe
from .wsd import first_senses, read_gold_keys, read_wsd_xml, run_wsd

__all__ = [
    "ProbeResult",
    "first_senses",
    "read_gold_keys",
    "read_tagged",
    "read_wsd_xml",
    "run_probe",
    "run_wsd",
]
