"""Tokens: the teacher's prompt as the model reads it, piece by piece, with ids, special tokens, the chat template,
counts, a decode round trip, and a second model's tokenizer beside it.

Numbers: `engine.instruments.readout.token_table` / `chars_per_token`; the tokenizer is the loaded model's own.
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from calculators.claims import token_count_claim
from engine import Model
from engine.load.built_tokenizers import PROJECT_BPE_VOCAB, byte_tokenizer, project_bpe
from engine.load.default_model import DISPLAY_NAME
from engine.instruments.readout import chars_per_token, token_table
from specs.model_config import SpecError
from ui import df_with_download, formula_expander, model_picker, setup_page, show_error
from ui.inside import Prompt, pieces_html, teacher_prompt
from ui.model_picker import DEFAULT_CHOICE, DEFAULT_SOURCE, load_shared
from ui.widgets import remember

COMPARE_KEY = "tokens.compare"
COMPARE_PATH_KEY = "tokens.compare_path"
NO_COMPARE = "(none)"
FOLDER = "A local tokenizer (Hugging Face folder or .gguf file)"
BYTES = "Bytes: one token per UTF-8 byte (256 ids, as byte-level models such as ByT5)"
PROJECT_BPE = f"A small BPE trained here on this project's docs ({PROJECT_BPE_VOCAB:,} ids)"


def show_tokens(model: Model, prompt: Prompt) -> None:
    tok = model.tokenizer
    ids = list(prompt.ids)
    rows = token_table(tok, ids)
    n_special = sum(r["special"] for r in rows)
    cpt = chars_per_token(prompt.model_text, len(ids))
    c = st.columns(4)
    c[0].metric("Tokens", f"{len(ids):,}")
    c[1].metric("Characters", f"{len(prompt.model_text):,}")
    c[2].metric("Characters per token", f"{cpt:.2f}")
    c[3].metric("Special tokens", f"{n_special:,}", help="Dark chips: markers the chat template adds, never typed.")
    st.markdown(pieces_html(rows), unsafe_allow_html=True)
    st.caption("Each chip is one token: the text it stands for (▁ = a space, ↵ = a new line) and, under it, its id "
               "in the vocabulary. Dark chips are special tokens.")
    formula_expander("Where these numbers come from",
                     f"- **Tokens** = the length of the id list the tokenizer returns ({len(ids):,}).\n"
                     f"- **Characters per token** = characters ÷ tokens = {len(prompt.model_text):,} ÷ {len(ids):,} "
                     f"= {cpt:.2f} (of the text the model reads, chat template included).\n"
                     f"- Vocabulary: {tok.vocab_size:,} ids; this prompt uses {len(set(ids)):,} distinct ones.\n\n"
                     "Source: 003 Detail 1")
    if prompt.use_chat:
        with st.expander("The chat template, rendered (what the model actually reads)", expanded=True):
            st.code(prompt.model_text, language=None, wrap_lines=True)
    back = tok.decode(ids)
    same = back == prompt.model_text
    (st.success if same else st.warning)(
        "Decode round trip: the ids decode back to exactly the text the model read."
        if same else "Decode round trip: the ids decode to a slightly different text (shown below); some tokenizers "
                     "normalise spaces or add a start token.", icon=":material/sync:")
    if not same:
        st.code(back, language=None, wrap_lines=True)
    df_with_download(pd.DataFrame(rows), "prompt_tokens", height=min(35 * (len(rows) + 1) + 3, 420))


def other_tokenizer(choice: str):
    """(name, tokenizer) to compare with, or None while the path box is empty. Raises SpecError/OSError."""
    from pathlib import Path

    from engine.load.tokenizer import Tokenizer
    if choice == DEFAULT_CHOICE:
        m = load_shared(DEFAULT_SOURCE)
        return m.config.name, m.tokenizer
    if choice == BYTES:
        return "UTF-8 bytes", byte_tokenizer()
    if choice == PROJECT_BPE:
        return "BPE trained on this project's docs", project_bpe()
    store = remember(COMPARE_PATH_KEY, "")
    path = st.text_input("Path", key=COMPARE_PATH_KEY, on_change=store,
                         placeholder="~/models/TinyLlama-1.1B-Chat-v1.0", help="Press Enter to load.").strip()
    if not path:
        st.info("Type the path of a Hugging Face model folder (with tokenizer.json) or of a .gguf file.")
        return None
    p = Path(path).expanduser()
    if p.is_dir():
        return p.name, Tokenizer.from_hf_folder(p)
    if p.suffix == ".gguf" and p.is_file():
        m = load_shared(str(p))
        if m.tokenizer is None:
            raise SpecError(f"{p.name} carries no tokenizer")
        return m.config.name, m.tokenizer
    raise SpecError(f"{p} is neither a folder nor a .gguf file")


def compare_tokenizers(model: Model, prompt: Prompt) -> None:
    """A second model's tokenizer on the same text (its weights are loaded once and shared like the first's)."""
    st.subheader("Another tokenizer, same text")
    same = model.config.name == DISPLAY_NAME        # the default model's tokenizer beside itself says nothing
    options = [NO_COMPARE, *([] if same else [DEFAULT_CHOICE]), PROJECT_BPE, BYTES, FOLDER]
    store = remember(COMPARE_KEY, NO_COMPARE)
    if st.session_state.get(COMPARE_KEY) not in options:
        st.session_state[COMPARE_KEY] = NO_COMPARE
    choice = st.selectbox("Compare with", options, key=COMPARE_KEY, on_change=store,
                          help="Offline: a byte-level BPE trained here (same algorithm as SmolLM2's, a far smaller "
                               "vocabulary learned from far less text) or plain UTF-8 bytes. A folder needs only "
                               "tokenizer.json (no weights are loaded); a .gguf file is loaded whole, like the "
                               "sidebar picker does.")
    if choice == NO_COMPARE:
        return
    try:
        other = other_tokenizer(choice)
    except (SpecError, OSError, MemoryError) as e:
        show_error(e)
        return
    if other is None:
        return
    text = prompt.text
    left, right = st.columns(2)
    counts = []
    for col, (name, tk) in ((left, (model.config.name, model.tokenizer)), (right, other)):
        rows = token_table(tk, tk.encode(text))
        counts.append((name, len(rows), tk.vocab_size))
        col.markdown(f"**{name}** · vocabulary {tk.vocab_size:,} · **{len(rows):,} tokens** "
                     f"({chars_per_token(text, len(rows)):.2f} characters per token)")
        col.markdown(pieces_html(rows), unsafe_allow_html=True)
    st.markdown(token_count_claim(*counts[0], *counts[1]))
    st.caption("Both read the typed text as is (no chat template), so the counts compare like with like.")


def main() -> None:
    setup_page("Tokens", icon=":material/segment:")
    st.title("Tokens")
    st.markdown(
        "A model never sees letters. Before anything else, a tokenizer cuts the text into pieces from a fixed "
        "vocabulary and replaces each piece by its number. Everything after this page works on those numbers, and "
        "every cost later in the course (time, memory, money) is counted per token.")
    model = model_picker()
    prompt = teacher_prompt(model)
    if model is None or prompt is None:
        return
    if model.tokenizer is None:
        st.info(f"{model.name} has no tokenizer, so there are no pieces to show: its prompts are typed as ids "
                f"({len(prompt.ids):,} here). Pick the default model to see text cut into tokens.")
        return
    show_tokens(model, prompt)
    compare_tokenizers(model, prompt)


main()
