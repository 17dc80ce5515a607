"""Random Transformer encoders saved as ``save_pretrained`` writes them, for tests and benchmarks.

A BERT-shaped model with a WordPiece tokenizer trained on the caller's text: every path of ``hf:DIR``
(:mod:`elmo_cache.model.transformer`) runs on it as on a published model, with no hub access. The cost
of a model depends on its shape, not on its weights. Needs the ``transformers`` extra.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["wordpiece_tokenizer", "write_random_bert"]

_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def wordpiece_tokenizer(texts: Iterable[str], vocab_size: int, *, lowercase: bool) -> Any:
    """A fast WordPiece tokenizer (BERT's specials and template) trained on ``texts``: with a vocabulary smaller
    than the text's, rarer words split into pieces as in real text."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    t.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    t.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=_SPECIALS))
    cls, sep = t.token_to_id("[CLS]"), t.token_to_id("[SEP]")
    t.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    t.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(
        tokenizer_object=t,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def write_random_bert(
    directory: Path,
    tokenizer: Any,
    *,
    hidden: int,
    blocks: int,
    heads: int,
    intermediate: int,
    positions: int,
    seed: int = 0,
) -> Path:
    """Save a randomly initialised BERT of this shape with ``tokenizer`` into ``directory``; returns it."""
    import torch
    from transformers import AutoModel, BertConfig

    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=blocks,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=positions,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    AutoModel.from_config(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return Path(directory)
