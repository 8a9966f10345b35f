"""Text <-> token ids, for the engine and for the pages that show tokens.

`Tokenizer` wraps a Hugging Face `tokenizers.Tokenizer` (the fast Rust BPE) and adds what a chat engine needs
around it: the model's BOS convention, its end-of-generation ids, its chat template, readable pieces for display,
and `StreamDecoder`, which turns a stream of generated ids into text that can be printed as it arrives.

Two ways to build one:
  * `Tokenizer.from_hf_folder(path)`: a Hugging Face model folder (tokenizer.json + tokenizer_config.json, ...).
  * `Tokenizer.from_gguf_fields(fields)`: the metadata of a GGUF file. A GGUF carries no tokenizer.json, only
    the vocabulary (and merges or scores) under llama.cpp's key names, so the tokenizer is rebuilt from them:
      - tokenizer.ggml.model == "gpt2":  byte-level BPE (GPT-2, SmolLM2, Llama-3, Qwen2): every byte is spelled
        as one printable character ("Ġ" is the space byte), merges are listed in the file.
      - tokenizer.ggml.model == "llama": SentencePiece-style BPE (Llama-2, TinyLlama, Mistral): a space is spelled
        "▁" and one is put in front of the text; characters missing from the vocabulary fall back to byte tokens
        "<0xE2>"; the file lists no merges, so they are derived from the vocabulary ranked by score.

Every token is, underneath, a sequence of bytes (`token_bytes`); a character may be split across tokens (an emoji
is 4 bytes), which is why streaming text must hold incomplete UTF-8 back.
"""
from __future__ import annotations

import codecs
import json
import re
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from engine.errors import ModelError

try:  # the Rust tokenizers library is a runtime requirement (requirements.txt); say so clearly if missing
    import tokenizers
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
except ImportError as _e:  # pragma: no cover - exercised only on a broken install
    raise ModelError("the 'tokenizers' package is missing: run `pip install -r requirements.txt`") from _e

SPACE_MARK = "\u2581"  # "▁", SentencePiece's visible space

# GGUF token types (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Control tokens that end generation although the file does not name them EOS (llama.cpp does the same).
END_OF_GENERATION_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>",
    "<|end_of_text|>",
})

# Pre-tokenizer split rules: llama.cpp's names (tokenizer.ggml.pre) -> the regex that cuts text into words
# before BPE. "gpt2"-style files without a known name use GPT-2's own regex (ByteLevel's built-in).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLIT_BY_PRE = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT, "falcon3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}
# These split every digit on its own, then apply GPT-2's regex (llama.cpp: "\p{N}" then the GPT-2 rule).
_DIGITS_THEN_GPT2 = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"})


@lru_cache(maxsize=1)
def byte_to_char() -> dict[int, str]:
    """GPT-2's byte -> printable character table: printable bytes map to themselves, the rest to U+0100... ."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@lru_cache(maxsize=1)
def char_to_byte() -> dict[str, int]:
    return {c: b for b, c in byte_to_char().items()}


def _hex_bytes(err: UnicodeDecodeError) -> tuple[str, int]:
    """codecs error handler: show bytes that are not (yet) a whole character as <0xF0>, SentencePiece-style."""
    bad = err.object[err.start:err.end]
    return "".join(f"<0x{b:02X}>" for b in bad), err.end


codecs.register_error("engine_hex", _hex_bytes)
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_VISIBLE = {" ": SPACE_MARK, "\n": "↵", "\t": "⇥", "\r": "␍"}


class Tokenizer:
    """A model's tokenizer: `encode`, `decode`, chat template, and the per-token bytes used for streaming.

    piece_kind says how a vocabulary entry spells its bytes: "byte_level" (GPT-2 alphabet), "sentencepiece"
    ("▁" for space, "<0xNN>" byte tokens) or "plain" (ask the backend's decoder, token by token).
    strips_leading_space: the decoder drops the one space SentencePiece puts in front of the text.
    """

    def __init__(self, backend: "tokenizers.Tokenizer", *, bos_token_id: int | None = None,
                 eos_token_ids: Iterable[int] = (), add_bos: bool = False, chat_template: str | None = None,
                 piece_kind: str = "plain", strips_leading_space: bool = False,
                 special_tokens_map: Mapping[str, str] | None = None, source: str = ""):
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(int(i) for i in eos_token_ids))
        self.add_bos = bool(add_bos and bos_token_id is not None)
        self.chat_template = chat_template or None
        self.piece_kind = piece_kind
        self.strips_leading_space = strips_leading_space
        self.source = source
        self._added = {int(i): tok for i, tok in backend.get_added_tokens_decoder().items()}
        self.special_ids: frozenset[int] = frozenset(i for i, tok in self._added.items() if tok.special)
        self._bytes_cache: dict[int, bytes] = {}
        stm = dict(special_tokens_map or {})
        if bos_token_id is not None:
            stm.setdefault("bos_token", self.id_to_token(bos_token_id))
        if self.eos_token_ids:
            stm.setdefault("eos_token", self.id_to_token(self.eos_token_ids[0]))
        self.special_tokens_map = {k: v for k, v in stm.items() if v is not None}

    # -- sizes and names ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (base vocabulary + added tokens)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens_map.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens_map.get("eos_token")

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry as stored (e.g. "▁Write", "Ġstory", "<0x0A>")."""
        return self.backend.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def __repr__(self) -> str:
        return (f"Tokenizer({self.piece_kind}, vocab={self.vocab_size}, bos={self.bos_token_id}, "
                f"eos={self.eos_token_ids}, add_bos={self.add_bos}, source={self.source!r})")

    # -- text <-> ids ------------------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`. Special tokens written in the text (e.g. "<|im_start|>") become their ids.

        add_bos: None = the model's convention (TinyLlama/Llama-2: yes; SmolLM2: no). A BOS is never doubled
        when the text already starts with it (chat templates often write it themselves).
        """
        if not isinstance(text, str):
            raise ModelError(f"encode() needs a string, got {type(text).__name__}")
        # encode_batch releases the GIL while the Rust code runs (encode does not): a long prompt tokenised in one
        # thread never freezes the others (a server's event loop, its other streams)
        try:
            ids = self.backend.encode_batch([text], add_special_tokens=False)[0].ids
        except TypeError:                   # the backend takes only valid Unicode: a lone surrogate ("\\ud800")
            bad = next((i for i, ch in enumerate(text) if 0xD800 <= ord(ch) <= 0xDFFF), None)
            if bad is None:
                raise
            raise ModelError(f"the text holds a lone surrogate (U+{ord(text[bad]):04X} at character {bad}), which "
                             f"is not valid Unicode; send UTF-8 text") from None
        want_bos = self.add_bos if add_bos is None else add_bos
        if want_bos and self.bos_token_id is not None and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id, *ids]
        return list(ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids` (the backend's decoder: undoes byte-level / "▁" spelling, joins byte tokens)."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (may be part of a UTF-8 character). Cached per id."""
        token_id = int(token_id)
        b = self._bytes_cache.get(token_id)
        if b is None:
            b = self._compute_token_bytes(token_id)
            self._bytes_cache[token_id] = b
        return b

    def _compute_token_bytes(self, token_id: int) -> bytes:
        piece = self.backend.id_to_token(token_id)
        if piece is None:
            raise ModelError(f"token id {token_id} is outside this tokenizer's vocabulary ({self.vocab_size} ids)")
        if token_id in self._added:  # added / special tokens are literal text
            if self.piece_kind == "byte_level" and set(piece) <= set(char_to_byte()):
                return bytes(char_to_byte()[c] for c in piece)
            return piece.encode("utf-8")
        if self.piece_kind == "byte_level":
            c2b = char_to_byte()
            return b"".join(bytes([c2b[c]]) if c in c2b else c.encode("utf-8") for c in piece)
        if self.piece_kind == "sentencepiece":
            m = _BYTE_PIECE.match(piece)
            if m:
                return bytes([int(m.group(1), 16)])
            return piece.replace(SPACE_MARK, " ").encode("utf-8")
        return self.backend.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """One readable string per id, for showing tokens: the same convention for every tokenizer.

        A space is shown as "▁" ("Ġstory" and "▁story" both show as "▁story"), a newline as "↵", a tab as "⇥";
        bytes that are only part of a character are shown as <0xF0>. Special tokens show as written ("<s>").
        """
        out = []
        for i in ids:
            i = int(i)
            if i in self.special_ids:
                out.append(self.id_to_token(i) or "")
                continue
            text = self.token_bytes(i).decode("utf-8", errors="engine_hex")
            out.append("".join(_VISIBLE.get(ch, ch) if (ch in _VISIBLE or ch.isprintable())
                               else f"<0x{ord(ch):02X}>" for ch in text))
        return out

    # -- chat --------------------------------------------------------------------------------------
    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            **extra: Any) -> str:
        """Render `messages` ([{"role": "user", "content": "..."}, ...]) into the prompt text the model was
        fine-tuned on, with the model's Jinja template, the way transformers renders it."""
        if self.chat_template is None:
            raise ModelError("this model's tokenizer has no chat template (it is a base model, not a chat model): "
                             "use plain text completion instead of chat")
        msgs = _check_messages(messages)
        variables = {**{k: v for k, v in self.special_tokens_map.items()}, **extra}
        variables.setdefault("bos_token", "")
        variables.setdefault("eos_token", "")
        try:
            template = _compile_template(self.chat_template)
            return template.render(messages=msgs, add_generation_prompt=add_generation_prompt, **variables)
        except ModelError:
            raise
        except Exception as e:  # jinja2.TemplateError and errors raised inside the template
            raise ModelError(f"the model's chat template failed: {e}. Check the roles/order of the messages "
                             f"(most templates want system?, then alternating user/assistant)") from None

    # -- constructors ------------------------------------------------------------------------------
    @classmethod
    def from_hf_folder(cls, path: str | Path) -> "Tokenizer":
        """Tokenizer of a Hugging Face model folder: tokenizer.json (required), tokenizer_config.json (special
        tokens, add_bos_token, chat_template), chat_template.jinja, special_tokens_map.json, generation_config.json
        (extra end-of-generation ids)."""
        folder = Path(path)
        tj = folder / "tokenizer.json"
        if not tj.is_file():
            hint = (" (only a SentencePiece tokenizer.model is there: this engine needs the fast-tokenizer file "
                    "tokenizer.json, which transformers writes with tokenizer.save_pretrained)"
                    if (folder / "tokenizer.model").is_file() else "")
            raise ModelError(f"no tokenizer.json in {folder}{hint}")
        try:
            raw = tj.read_text(encoding="utf-8")
            spec = json.loads(raw)
            backend = tokenizers.Tokenizer.from_str(raw)
        except Exception as e:
            raise ModelError(f"{tj} could not be read as a Hugging Face tokenizer ({e}); "
                             f"re-download it or replace it with the model's original tokenizer.json") from None
        cfg = _read_json_optional(folder / "tokenizer_config.json")
        stm = _read_json_optional(folder / "special_tokens_map.json")
        gen = _read_json_optional(folder / "generation_config.json")
        names = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            v = _token_content(cfg.get(key)) or _token_content(stm.get(key))
            if v is not None:
                names[key] = v

        def tid(name: str | None) -> int | None:
            return backend.token_to_id(name) if name else None

        bos_id = tid(names.get("bos_token"))
        if bos_id is None and isinstance(gen.get("bos_token_id"), int):
            bos_id = gen["bos_token_id"]
        eos_ids = [i for i in [tid(names.get("eos_token"))] if i is not None]
        g = gen.get("eos_token_id")
        eos_ids += [g] if isinstance(g, int) else [i for i in (g or []) if isinstance(i, int)]
        add_bos = cfg.get("add_bos_token")
        if add_bos is None:
            add_bos = _post_processor_adds_bos(spec.get("post_processor"), names.get("bos_token"))
        template = _pick_chat_template(cfg.get("chat_template"))
        jinja_file = folder / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        kind, strips = _describe_decoder(spec.get("decoder"))
        return cls(backend, bos_token_id=bos_id, eos_token_ids=eos_ids, add_bos=bool(add_bos),
                   chat_template=template, piece_kind=kind, strips_leading_space=strips,
                   special_tokens_map=names, source=str(folder))

    @classmethod
    def from_gguf_fields(cls, fields: Mapping[str, Any], source: str = "") -> "Tokenizer":
        """Rebuild the tokenizer a GGUF file describes from its metadata (keys "tokenizer.ggml.*",
        values already decoded to Python lists/str/int)."""
        kind = fields.get("tokenizer.ggml.model")
        tokens = fields.get("tokenizer.ggml.tokens")
        if not tokens:
            raise ModelError(f"{source or 'this GGUF file'} has no tokenizer (no tokenizer.ggml.tokens)")
        tokens = [str(t) for t in tokens]
        types = [int(t) for t in fields.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)]
        if kind == "gpt2":
            backend = _byte_level_backend(tokens, fields.get("tokenizer.ggml.merges"),
                                          fields.get("tokenizer.ggml.pre"), source)
            piece_kind, strips, default_bos = "byte_level", False, False
        elif kind == "llama":
            add_space = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
            unk = fields.get("tokenizer.ggml.unknown_token_id")
            backend = _sentencepiece_backend(tokens, fields.get("tokenizer.ggml.scores"),
                                             fields.get("tokenizer.ggml.merges"), add_space,
                                             tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens) else None)
            piece_kind, strips, default_bos = "sentencepiece", add_space, True
        else:
            raise ModelError(f"{source or 'this GGUF file'} uses tokenizer type {kind!r}; this engine rebuilds "
                             f"'gpt2' (byte-level BPE) and 'llama' (SentencePiece BPE) tokenizers only")
        _add_gguf_special_tokens(backend, tokens, types, byte_level=(kind == "gpt2"))

        def known(key: str) -> int | None:
            v = fields.get(key)
            return int(v) if isinstance(v, int) and 0 <= v < len(tokens) else None

        bos = known("tokenizer.ggml.bos_token_id")
        eos = [i for i in (known("tokenizer.ggml.eos_token_id"), known("tokenizer.ggml.eot_token_id"),
                           known("tokenizer.ggml.eom_token_id")) if i is not None]
        eos += [i for i, (t, ty) in enumerate(zip(tokens, types))
                if ty == TOKEN_CONTROL and t in END_OF_GENERATION_TEXTS]
        add_bos = fields.get("tokenizer.ggml.add_bos_token")
        names = {}
        for key, field in (("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
            i = known(f"tokenizer.ggml.{field}")
            if i is not None:
                names[key] = tokens[i]
        return cls(backend, bos_token_id=bos, eos_token_ids=eos,
                   add_bos=default_bos if add_bos is None else bool(add_bos),
                   chat_template=fields.get("tokenizer.chat_template"), piece_kind=piece_kind,
                   strips_leading_space=strips, special_tokens_map=names, source=source)


class StreamDecoder:
    """Turns generated ids into printable text, one id at a time.

    Why not decode each token alone? A SentencePiece piece "▁world" must print " world", but the first piece of a
    text loses its "▁"; an emoji may arrive as 4 byte tokens whose first 3 are not text yet. So we keep the raw
    bytes and hand out only the complete UTF-8 characters; the rest waits for the next token or `flush()`.
    Concatenating every `push()` and the final `flush()` gives `tokenizer.decode(ids)` for any valid text.

    continuation=True: the ids continue text already on screen (the prompt), so the first token keeps its leading
    space ("Write a story" + "▁about" -> " about"); then the pushes equal
    decode(prompt + ids)[len(decode(prompt)):].
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False, continuation: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._pending = b""            # bytes of an unfinished character
        self._started = continuation   # has text been seen (the one stripped leading space is only at the start)

    def push(self, token_id: int) -> str:
        """Add one token; return the new text that is now complete ("" when it must wait)."""
        token_id = int(token_id)
        if self.skip_special_tokens and token_id in self.tokenizer.special_ids:
            return ""
        piece = self.tokenizer.token_bytes(token_id)
        if not self._started and piece:
            self._started = True
            if self.tokenizer.strips_leading_space and piece.startswith(b" "):
                piece = piece[1:]
        data = self._pending + piece
        cut = _complete_utf8_prefix(data)
        self._pending = data[cut:]
        return data[:cut].decode("utf-8", errors="replace")

    def flush(self) -> str:
        """Whatever is still held back (bytes that never became a whole character print as U+FFFD)."""
        data, self._pending = self._pending, b""
        return data.decode("utf-8", errors="replace")


# ---- helpers: UTF-8 ----------------------------------------------------------------------------------
def _complete_utf8_prefix(data: bytes) -> int:
    """Length of `data` up to (not including) a trailing, still incomplete UTF-8 character."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 == 0x80:          # continuation byte: look further back for its lead byte
            continue
        if b >= 0xC0:                 # lead byte: how many bytes its character needs
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4 if b < 0xF8 else 1
            return n - back if back < need else n
        return n                      # ASCII: everything before is complete
    return n


# ---- helpers: Hugging Face folder ------------------------------------------------------------------
def _read_json_optional(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path} is not valid JSON ({e}); re-download it from the model's repository") from None
    return doc if isinstance(doc, dict) else {}


def _token_content(v: Any) -> str | None:
    """tokenizer_config.json writes a special token as "<s>" or as {"content": "<s>", ...}."""
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def _pick_chat_template(v: Any) -> str | None:
    """chat_template is a string, or a list of {"name", "template"} of which "default" is the chat one."""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        named = {d.get("name"): d.get("template") for d in v if isinstance(d, dict)}
        t = named.get("default") or next(iter(named.values()), None)
        return t if isinstance(t, str) else None
    return None


def _post_processor_adds_bos(pp: Any, bos: str | None) -> bool:
    """Does tokenizer.json's post-processor put a special token first (Llama-2/3 style)?"""
    if not isinstance(pp, dict) or bos is None:
        return False
    if pp.get("type") == "Sequence":
        return any(_post_processor_adds_bos(p, bos) for p in pp.get("processors", []))
    if pp.get("type") == "TemplateProcessing":
        first = (pp.get("single") or [{}])[0]
        return isinstance(first, dict) and first.get("SpecialToken", {}).get("id") == bos
    return False


def _describe_decoder(dec: Any) -> tuple[str, bool]:
    """(piece_kind, strips_leading_space) read from tokenizer.json's "decoder" section."""
    parts = dec.get("decoders", []) if isinstance(dec, dict) and dec.get("type") == "Sequence" else [dec]
    parts = [p for p in parts if isinstance(p, dict)]
    types = {p.get("type") for p in parts}
    strips = any(p.get("type") == "Strip" and p.get("content") == " " and int(p.get("start", 0)) >= 1
                 for p in parts)
    strips |= any(p.get("type") == "Metaspace" and (p.get("prepend_scheme") in ("first", "always")
                                                    or p.get("add_prefix_space") is True) for p in parts)
    if "ByteLevel" in types:
        return "byte_level", False
    replaces_mark = any(p.get("type") == "Replace" and p.get("pattern", {}).get("String") == SPACE_MARK
                        for p in parts)
    if types & {"ByteFallback", "Metaspace"} or replaces_mark:
        return "sentencepiece", strips
    return "plain", strips


# ---- helpers: GGUF -----------------------------------------------------------------------------------
def _vocab(tokens: Sequence[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # a duplicated spelling keeps its first id
    return vocab


def _split_merges(merges: Sequence[str]) -> list[tuple[str, str]]:
    out = []
    for m in merges:
        left, sep, right = str(m).partition(" ")
        if sep:
            out.append((left, right))
    return out


def _byte_level_backend(tokens: list[str], merges: Sequence[str] | None, pre: str | None,
                        source: str) -> "tokenizers.Tokenizer":
    """GPT-2-style byte-level BPE: vocabulary + merges from the file, split rule chosen by tokenizer.ggml.pre."""
    if not merges:
        raise ModelError(f"{source or 'this GGUF file'} has a byte-level BPE tokenizer without merges "
                         f"(tokenizer.ggml.merges); the file looks damaged, re-download it")
    b2c = byte_to_char()
    alphabet = set(b2c.values())
    # a token spelled outside the byte alphabet (rare, written by some converters) is respelled byte by byte
    spelled = [t if set(t) <= alphabet else "".join(b2c[b] for b in t.encode("utf-8")) for t in tokens]
    backend = tokenizers.Tokenizer(models.BPE(_vocab(spelled), _split_merges(merges), fuse_unk=False))
    split = _SPLIT_BY_PRE.get(pre or "")
    if split is not None:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre in _DIGITS_THEN_GPT2:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    return backend


def derive_merges(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE stores no merges: a token's score ranks when it was formed. Every way of cutting a token
    into two tokens of the vocabulary is a merge, ranked by the merged token's score (best first; ties: longer
    left part, then longer right part), as transformers' converters do."""
    vocab = _vocab(tokens)
    merges = []
    for piece, score in zip(tokens, scores):
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
        merges += [(float(score), len(l_), len(r_), l_, r_) for l_, r_ in local]
    merges.sort(key=lambda m: (m[0], m[1], m[2]), reverse=True)  # stable: equal keys keep vocabulary order
    return [(l_, r_) for _, _, _, l_, r_ in merges]


def _sentencepiece_backend(tokens: list[str], scores: Sequence[float] | None, merges: Sequence[str] | None,
                           add_space_prefix: bool, unk: str | None) -> "tokenizers.Tokenizer":
    """Llama-2-style BPE: "▁" for space (one put in front of each text), byte tokens for unknown characters."""
    if merges:
        pairs = _split_merges(merges)
    else:
        pairs = derive_merges(tokens, scores if scores is not None else [-float(i) for i in range(len(tokens))])
    backend = tokenizers.Tokenizer(models.BPE(_vocab(tokens), pairs, unk_token=unk, fuse_unk=True,
                                              byte_fallback=True))
    steps = [normalizers.Prepend(SPACE_MARK)] if add_space_prefix else []
    backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPACE_MARK)])
    chain = [decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        chain.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(chain)
    return backend


def _add_gguf_special_tokens(backend: "tokenizers.Tokenizer", tokens: list[str], types: list[int],
                             byte_level: bool) -> None:
    """Control tokens ("<|im_start|>", "<s>") must be matched whole in text, never cut by BPE: add them as special
    tokens; user-defined ones as plain added tokens (llama.cpp matches those whole too)."""
    alphabet = set(byte_to_char().values())
    control = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types)
               if ty == TOKEN_CONTROL and t and (not byte_level or set(t) <= alphabet)]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types)
            if ty == TOKEN_USER_DEFINED and t]
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)


# ---- helpers: chat template ---------------------------------------------------------------------------
def _check_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ModelError("chat messages must be a non-empty list of {'role': ..., 'content': ...}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ModelError(f"chat message {i} must be a dict with string 'role' and 'content', got {m!r}")
        out.append(dict(m))
    return out


@lru_cache(maxsize=16)
def _compile_template(source: str):
    """Jinja environment as transformers sets it up: sandboxed, trim_blocks/lstrip_blocks, loop controls,
    `raise_exception`, `strftime_now` and a `tojson` that keeps non-ASCII text."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ModelError(f"the model's chat template is not valid Jinja ({e}); fix chat_template in "
                         f"tokenizer_config.json") from None
