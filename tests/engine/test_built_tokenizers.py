"""The tokenizers built offline for the Tokens page's comparison (engine/load/built_tokenizers.py)."""
from __future__ import annotations

from engine.load.built_tokenizers import byte_tokenizer, project_bpe, trained_bpe

TEXT = "Write a story about Ünïcode 🙂 and the KV cache."


def test_byte_tokenizer_is_one_token_per_utf8_byte_and_round_trips():
    tok = byte_tokenizer()
    ids = tok.encode(TEXT)
    assert tok.vocab_size == 256 and len(ids) == len(TEXT.encode("utf-8"))
    assert ids == list(TEXT.encode("utf-8")) and tok.decode(ids) == TEXT
    assert [len(tok.token_bytes(i)) for i in ids] == [1] * len(ids)


def test_a_bpe_trained_here_learns_merges_and_round_trips():
    corpus = ["the cache keeps the keys and the values"] * 50
    tok = trained_bpe(corpus, vocab_size=300)
    assert 256 < tok.vocab_size <= 300
    ids = tok.encode("the cache keeps the values")
    assert len(ids) < len("the cache keeps the values".encode("utf-8"))      # merges: fewer tokens than bytes
    assert tok.decode(ids) == "the cache keeps the values"
    assert tok.decode(tok.encode(TEXT)) == TEXT                                 # bytes it never saw still encode


def test_project_bpe_is_trained_on_the_docs_and_needs_fewer_tokens_than_bytes():
    tok = project_bpe()
    assert tok.vocab_size == 1000
    ids = tok.encode("the KV cache and the bandwidth floor")
    assert len(ids) < len(byte_tokenizer().encode("the KV cache and the bandwidth floor"))
