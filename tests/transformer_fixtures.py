"""Tiny randomly initialised Transformer encoders with locally trained tokenizers, saved as save_pretrained
writes them: one per family (BERT with WordPiece, RoBERTa with byte-level BPE, XLM-R and DeBERTa-v2 with
Unigram/Metaspace, sentencepiece-style). Few positions, so that a sentence of a few dozen words needs windows.
No hub access."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FAMILIES = ("bert", "roberta", "xlmr", "deberta")

# Text the tokenizers are trained on: common words whole, rarer ones in pieces.
CORPUS = [
    "the cat sat on the mat .",
    "a quick brown fox jumps over the lazy dog",
    "unbelievable tokenisation of wordpieces and subwords",
    "Hello , world ! the committee met on tuesday to discuss the new budget",
    "officials said the plan would be published later this year",
] * 4

_SMALL = {"hidden_size": 16, "num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 32}


def _wordpiece() -> Any:
    from elmo_cache.model.random_transformer import wordpiece_tokenizer

    return wordpiece_tokenizer(CORPUS, 150, lowercase=True)


def _byte_bpe() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=350,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    t.train_from_iterator(CORPUS, trainer)
    t.post_processor = processors.RobertaProcessing(("</s>", t.token_to_id("</s>")), ("<s>", t.token_to_id("<s>")))
    t.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=t,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        cls_token="<s>",
        sep_token="</s>",
        mask_token="<mask>",
        add_prefix_space=True,
    )


def _unigram(cls: str, sep: str, pad: str, unk: str, mask: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [cls, pad, sep, unk, mask]
    t = Tokenizer(models.Unigram())
    t.normalizer = normalizers.NFKC()
    t.pre_tokenizer = pre_tokenizers.Metaspace()
    t.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=120, special_tokens=specials, unk_token=unk))
    t.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", special_tokens=[(cls, t.token_to_id(cls)), (sep, t.token_to_id(sep))]
    )
    t.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(
        tokenizer_object=t,
        unk_token=unk,
        pad_token=pad,
        cls_token=cls,
        sep_token=sep,
        mask_token=mask,
        bos_token=cls,
        eos_token=sep,
    )


def write_tiny_transformers(root: Path) -> dict[str, Path]:
    """Save one tiny model per family under ``root``; returns family -> directory."""
    import torch
    from transformers import AutoModel, BertConfig, DebertaV2Config, RobertaConfig, XLMRobertaConfig

    made: dict[str, Path] = {}
    for family in FAMILIES:
        if family == "bert":
            tokenizer = _wordpiece()
            config: Any = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=16, pad_token_id=0, **_SMALL)
        elif family == "roberta":
            tokenizer = _byte_bpe()
            config = RobertaConfig(
                vocab_size=len(tokenizer),
                max_position_embeddings=18,
                pad_token_id=1,
                bos_token_id=0,
                eos_token_id=2,
                **_SMALL,
            )
        elif family == "xlmr":
            tokenizer = _unigram("<s>", "</s>", "<pad>", "<unk>", "<mask>")
            config = XLMRobertaConfig(vocab_size=len(tokenizer), max_position_embeddings=18, pad_token_id=1, **_SMALL)
        else:
            tokenizer = _unigram("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]")
            config = DebertaV2Config(
                vocab_size=len(tokenizer),
                max_position_embeddings=16,
                pad_token_id=1,
                relative_attention=True,
                position_buckets=8,
                max_relative_positions=16,
                pos_att_type=["p2c", "c2p"],
                position_biased_input=False,
                **_SMALL,
            )
        torch.manual_seed(len(made))
        model = AutoModel.from_config(config)
        directory = root / family
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        made[family] = directory
    return made
