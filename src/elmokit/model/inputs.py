"""How a biLM's tokens become its input ids, and what its token encoder reads: the input
scheme. ``InputScheme`` is bilm-tf's (UTF-8 byte ids, <S> and </S>); a variant of the model
(``elmokit.model.manylangs``) gives its own, so ``BiLM`` builds every kind of model without a subclass
and the variant's reader needs no ``BiLM``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .characters import BOS_TOKEN, EOS_TOKEN, PADDING_CHAR, tokens_to_ids

__all__: list[str] = []


class InputScheme:
    """bilm-tf's inputs: ``token_ids`` gives the shifted byte ids (n_tokens, max_chars) of
    ``tokens_to_ids``. A scheme also says the sentence boundary tokens, the padding character's
    id, the word embedding's (rows, dim) or None, whether the token encoder always projects,
    what makes the model's inputs (for error messages), and why options.json cannot describe it
    (None: it can, the model can be saved in bilm-tf's layout)."""

    boundary_tokens: tuple[str, str] = (BOS_TOKEN, EOS_TOKEN)
    padding_id: int = PADDING_CHAR + 1
    word_embedding: tuple[int, int] | None = None
    always_project: bool = False
    ids_from: str = "elmokit.batch_to_ids"
    not_writable: str | None = None

    def __init__(self, max_characters_per_token: int) -> None:
        self.max_characters_per_token = max_characters_per_token

    def token_ids(self, tokens: Sequence[str]) -> torch.Tensor:
        """LongTensor (n_tokens, input_width) of each token's input ids, 0 never used by a token."""
        return tokens_to_ids(tokens, self.max_characters_per_token)
