"""Tokenizers built here, offline, to compare with a model's own on the Tokens page: nothing downloaded.

  * `byte_tokenizer()`: one token per UTF-8 byte, 256 ids (the scheme of byte-level models such as ByT5, Xue et al.
    2022, and the alphabet every byte-level BPE starts from): the longest sequences, no word ever unknown.
  * `trained_bpe(texts, vocab_size)`: a byte-level BPE (GPT-2's algorithm: start from the 256 bytes, merge the most
    frequent adjacent pair until the vocabulary is full; Sennrich et al. 2016) trained on `texts` with the
    `tokenizers` package's trainer. `project_bpe()` trains one on this project's own documentation (README.md and
    docs/*.md, which ship with the code): a small vocabulary learned from a small corpus, beside SmolLM2's 49,152
    learned from trillions of tokens.

Both are ordinary `engine.load.tokenizer.Tokenizer`s (byte-level pieces, no BOS, no chat template).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Iterable

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from engine.errors import ModelError
from engine.load.tokenizer import Tokenizer, byte_to_char

DOCS_ROOT = Path(__file__).resolve().parents[2]
PROJECT_BPE_VOCAB = 1000


def byte_tokenizer() -> Tokenizer:
    """Every UTF-8 byte its own token: 256 ids, spelled in GPT-2's printable byte alphabet ("Ġ" = the space)."""
    alphabet = byte_to_char()                                      # byte -> printable character
    vocab = {alphabet[b]: b for b in range(256)}
    backend = tokenizers.Tokenizer(models.BPE(vocab, [], fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return Tokenizer(backend, piece_kind="byte_level", source="bytes (UTF-8)")


def trained_bpe(texts: Iterable[str], vocab_size: int = PROJECT_BPE_VOCAB, source: str = "trained here") -> Tokenizer:
    """A byte-level BPE with `vocab_size` ids (the 256 bytes + learned merges) trained on `texts`."""
    backend = tokenizers.Tokenizer(models.BPE(fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(list(texts), trainer=trainer)
    return Tokenizer(backend, piece_kind="byte_level", source=source)


def project_texts(root: Path = DOCS_ROOT) -> list[str]:
    """The documentation this project ships (README.md, docs/*.md): the corpus `project_bpe` learns from."""
    files = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    texts = [f.read_text(encoding="utf-8") for f in files if f.is_file()]
    if not texts:
        raise ModelError(f"no documentation under {root} to train a tokenizer on")
    return texts


@lru_cache(maxsize=1)
def project_bpe(vocab_size: int = PROJECT_BPE_VOCAB) -> Tokenizer:
    """A `vocab_size`-id byte-level BPE trained on this project's documentation (trained once per process)."""
    return trained_bpe(project_texts(), vocab_size, source=f"BPE trained on this project's docs ({vocab_size:,})")
