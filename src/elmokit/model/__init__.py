"""The model layer: the biLM (character ids, char CNN, highway, LSTM), its options and weight
files (bilm-tf's and ELMoForManyLangs' layouts), the token cache, int8, and ``Elmo``."""

__all__: list[str] = []
