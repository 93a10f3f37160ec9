"""The language model: the vocabulary, the softmax, ``LanguageModel``, sentence scores and
substitutes, the start state, and checkpoint folders."""

__all__: list[str] = []
