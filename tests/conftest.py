"""Shared fixtures: tiny random BERT- and GPT-2-style models built and saved in Hugging Face
format (config, safetensors, a tokenizer made from a generated vocabulary), loaded through the
same path as real models; and the real offline default model for slow tests."""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"

WORDS = (
    "the a an of to in and on for with he she it they we his her their this that is was were be "
    "has had have will would can could dog cat man woman child house car tree river city book "
    "said saw gave took made found asked told ran walked ate read wrote bought old new big small "
    "red blue happy sad quick slow john mary london paris monday friday"
).split()
PIECES = ["##s", "##ed", "##ing", "##ly", "##er", "##est", "un", "##able", "##ness", "re", "##y"]


def _bert_vocab() -> list[str]:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = list(string.ascii_lowercase) + ["##" + c for c in string.ascii_lowercase]
    punct = list(".,;:!?'\"()-")
    return specials + punct + chars + WORDS + PIECES


def build_tiny_bert(directory: Path, seed: int = 0) -> Path:
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    vocab = _bert_vocab()
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        type_vocab_size=2,
    )
    BertForMaskedLM(cfg).save_pretrained(directory, safe_serialization=True)
    tok.save_pretrained(directory)
    return directory


def build_tiny_gpt2(directory: Path, seed: int = 0) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = [" ".join(WORDS[i : i + 9]) + " ." for i in range(0, len(WORDS), 3)] * 5
    bpe.train_from_iterator(corpus, trainer)
    tok = GPT2TokenizerFast(
        tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )
    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=len(tok),
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    GPT2LMHeadModel(cfg).save_pretrained(directory, safe_serialization=True)
    tok.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-bert")


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory) -> Path:
    return build_tiny_gpt2(tmp_path_factory.mktemp("models") / "tiny-gpt2")


@pytest.fixture(scope="session")
def tiny_bert(tiny_bert_dir):
    from depthprobe.probes import load

    return load(str(tiny_bert_dir), device="cpu")


@pytest.fixture(scope="session")
def tiny_gpt2(tiny_gpt2_dir):
    from depthprobe.probes import load

    return load(str(tiny_gpt2_dir), device="cpu")


@pytest.fixture(scope="session")
def minilm():
    from depthprobe.probes import load

    return load("minilm", device="cpu")


PLAYS = REPO / "tasks" / "data" / "tinyshakespeare.txt"


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """The tests' tiny local corpus: the first 60,000 characters (about 60 KB) of the built-in plays
    (tasks/data/tinyshakespeare.txt) as ``corpus/plays.txt``, written once per session. Shared: a
    test that changes it, or adds to its folder, works on a copy."""
    path = tmp_path_factory.mktemp("corpus") / "plays.txt"
    path.write_text(PLAYS.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    return path


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip("../shared/data is not beside the repository")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_family_dir(tmp_path_factory):
    """family name -> folder of its tiny random model (built once per session, on first use)."""
    from tests.tiny_families import build

    root = tmp_path_factory.mktemp("families")
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build(family, root / family)
        return built[family]

    return get


@pytest.fixture(scope="module")
def ray_instance():
    """A real local Ray instance (2 CPUs), for the tests of one module."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
