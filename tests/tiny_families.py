"""Tiny random models of many Hugging Face families, saved in Hugging Face format with small
tokenizers that reproduce their families' word-boundary behaviour:

- ``bytelevel``: byte-level BPE without a prefix space (GPT-2, GPT-NeoX, OPT, GPT-J, Phi, Qwen2,
  Llama-3): every word after the first carries its space as ``\u0120``; the first word has none;
- ``metaspace-first``: SentencePiece-style ``\u2581`` pieces with a ``\u2581`` prepended to the first word too
  (Llama-2, Mistral, T5, ALBERT, DeBERTa-v2);
- ``metaspace-never``: ``\u2581`` replaces spaces but nothing is prepended (Gemma);
- ``wordpiece``: BERT's WordPiece (BERT, DistilBERT, ELECTRA);
- ``roberta``: byte-level BPE with ``<s> ... </s>`` (RoBERTa, BART).

Each family is (config class, model class, config kwargs, tokenizer kind).
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

from tests.conftest import WORDS, _bert_vocab

HIDDEN = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
ROPE = dict(HIDDEN, max_position_embeddings=256)

# family -> (config class, model class, config kwargs, tokenizer kind)
FAMILIES: dict[str, tuple[str, str, dict, str]] = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=4, n_positions=256), "bytelevel"),
    "gpt-neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(ROPE, rotary_pct=0.5), "bytelevel"),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(ROPE, num_key_value_heads=2), "metaspace-first"),
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        dict(ROPE, num_key_value_heads=2, sliding_window=None),
        "metaspace-first",
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(ROPE, num_key_value_heads=2), "bytelevel"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(ROPE, num_key_value_heads=4, head_dim=8), "metaspace-never"),
    "phi": ("PhiConfig", "PhiForCausalLM", dict(ROPE, partial_rotary_factor=0.5), "bytelevel"),
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=64,
            word_embed_proj_dim=32,
            max_position_embeddings=256,
        ),
        "bytelevel",
    ),
    "gpt-j": (
        "GPTJConfig",
        "GPTJForCausalLM",
        dict(n_embd=32, n_layer=2, n_head=4, n_positions=256, rotary_dim=4),
        "bytelevel",
    ),
    "bert": ("BertConfig", "BertForMaskedLM", dict(HIDDEN, max_position_embeddings=256), "wordpiece"),
    "roberta": (
        "RobertaConfig",
        "RobertaForMaskedLM",
        dict(HIDDEN, max_position_embeddings=260, pad_token_id=1),
        "roberta",
    ),
    # families TransformerLens 4.3 does not support
    "distilbert": (
        "DistilBertConfig",
        "DistilBertForMaskedLM",
        dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=256),
        "wordpiece",
    ),
    "albert": (
        "AlbertConfig",
        "AlbertForMaskedLM",
        dict(HIDDEN, embedding_size=16, max_position_embeddings=256),
        "metaspace-first",
    ),
    "electra": (
        "ElectraConfig",
        "ElectraForMaskedLM",
        dict(HIDDEN, embedding_size=32, max_position_embeddings=256),
        "wordpiece",
    ),
    "deberta-v2": (
        "DebertaV2Config",
        "DebertaV2ForMaskedLM",
        dict(HIDDEN, max_position_embeddings=256),
        "metaspace-first",
    ),
    # encoder-decoder
    "t5": (
        "T5Config",
        "T5ForConditionalGeneration",
        dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, decoder_start_token_id=0),
        "metaspace-first",
    ),
    "bart": (
        "BartConfig",
        "BartForConditionalGeneration",
        dict(
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=256,
        ),
        "roberta",
    ),
}
SUPPORTED = ("gpt2", "gpt-neox", "llama", "mistral", "qwen2", "gemma", "phi", "opt", "gpt-j", "bert", "roberta")
FALLBACK = ("distilbert", "albert", "electra", "deberta-v2")
SEQ2SEQ = ("t5", "bart")

CORPUS = [" ".join(WORDS[i : i + 9]) + " ." for i in range(0, len(WORDS), 3)] * 5
ALPHABET = list(string.ascii_letters + string.digits + string.punctuation)


def build_tokenizer(kind: str):
    """A small trained tokenizer of ``kind`` wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast, PreTrainedTokenizerFast

    if kind == "wordpiece":
        vocab = _bert_vocab()
        return BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)
    if kind in ("bytelevel", "roberta"):
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"] if kind == "roberta" else ["<|endoftext|>"]
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=320, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
        bpe.train_from_iterator(CORPUS, trainer)
        if kind == "bytelevel":
            end = "<|endoftext|>"
            return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=end, eos_token=end, unk_token=end)
        bpe.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), add_prefix_space=False)
        return PreTrainedTokenizerFast(
            tokenizer_object=bpe,
            bos_token="<s>",
            eos_token="</s>",
            cls_token="<s>",
            sep_token="</s>",
            pad_token="<pad>",
            unk_token="<unk>",
            mask_token="<mask>",
        )
    scheme = {"metaspace-first": "first", "metaspace-never": "never"}[kind]
    specials = ["<pad>", "</s>", "<s>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.normalizer = normalizers.NFKC()
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme)
    bpe.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=scheme)
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=specials, initial_alphabet=[*ALPHABET, "▁"])
    bpe.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def build(family: str, directory: Path, seed: int = 0) -> Path:
    """Build, save and return the folder of a tiny random model of ``family``."""
    import transformers

    cfg_cls, model_cls, kwargs, kind = FAMILIES[family]
    directory.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(kind)
    ids = dict(
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    ids.update({k: v for k, v in kwargs.items() if k == "pad_token_id"})
    vocab = max(len(tok), max(tok.get_vocab().values()) + 1)  # ids may have gaps
    cfg = getattr(transformers, cfg_cls)(vocab_size=vocab, **{**kwargs, **ids})
    torch.manual_seed(seed)
    getattr(transformers, model_cls)(cfg).save_pretrained(directory, safe_serialization=True)
    tok.save_pretrained(directory)
    return directory
