"""Speculative decoding: a cheap draft guesses K tokens, the full model checks them in one pass. The formula
(expected tokens per pass, speedup) and a real run on the engine with an early-exit draft: same tokens as plain
greedy decoding, measured acceptance and wall-time speedup next to the formula's prediction.

Numbers: `calculators.serving.speculative` (expected_tokens_per_pass, speculative_speedup),
`calculators.explain.explain_speculative`; measured: `engine.serve.serving_runs.speculative_run` with
`engine.serve.speculative.early_exit_draft`.
"""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from calculators.explain import explain_speculative
from calculators.serving.speculative import expected_tokens_per_pass, speculative_speedup
from calculators.units import fmt_num
from engine.serve.serving_runs import speculative_run
from engine.serve.speculative import LOOKUP_EXAMPLES, PromptLookup, early_exit_draft
from specs.model_config import SpecError
from ui import df_with_download, float_field, formula_expander, int_field, model_picker, setup_page, show_error
from ui.serving import measured_run, style
from engine.threads import measured_under_load
from ui.narration import acceptance_words, busy_notice, formula_gap_words, speculative_words

ALPHAS = [i / 20 for i in range(21)]
KS = (1, 2, 4, 8)


def theory() -> None:
    st.subheader("The formula")
    c = st.columns(3)
    alpha = float_field("Acceptance α (per draft token)", 0.8, 0.0, 1.0, key="spec.alpha", where=c[0], step=0.05)
    k = int_field("Draft tokens K", 4, 1, 64, key="spec.k", where=c[1])
    cost = float_field("Draft step cost (fraction of a target step)", 0.1, 0.0, 10.0, key="spec.cost", where=c[2],
                       step=0.05)
    if None in (alpha, k, cost):
        return
    try:
        ex = explain_speculative(alpha, k)
        speed = speculative_speedup(alpha, k, cost)
    except SpecError as e:
        show_error(e)
        return
    fig = go.Figure([go.Scatter(x=ALPHAS, y=[expected_tokens_per_pass(a, kk) for a in ALPHAS], name=f"K = {kk}",
                                mode="lines", line=dict(width=3)) for kk in KS])
    fig.add_scatter(x=[alpha], y=[ex.value], mode="markers", marker=dict(size=14, color="black"),
                    name=f"α {alpha:g}, K {k}")
    st.plotly_chart(style(fig, "Expected tokens per target pass", "acceptance α", "tokens", height=420),
                    key="spec.curve")
    c = st.columns(2)
    c[0].metric("Tokens per target pass", fmt_num(ex.value, 3))
    c[1].metric("Speedup over plain decoding", f"{fmt_num(speed, 3)}×",
                help="E[tokens] ÷ (1 + K × draft cost): one verification pass plus K draft steps per round, "
                     "decode bandwidth-bound (Leviathan et al. 2022).")
    formula_expander("The arithmetic", f"**{ex.name}** `{ex.symbolic}`: {ex.formula}  \n_{ex.source}_\n\n"
                     f"Speedup = E[tokens] ÷ (1 + K × c) with c = {cost:g}: {fmt_num(speed, 4)}×. "
                     "003 Detail 19 with K = 4: α 0.8 → ≈ 3.4 tokens, 0.5 → ≈ 1.9, 0.2 → ≈ 1.2.")
    df_with_download(pd.DataFrame([dict(alpha=a, **{f"K={kk}": expected_tokens_per_pass(a, kk) for kk in KS})
                                   for a in ALPHAS]), "speculative_tokens_per_pass")


DRAFTS = ("prompt lookup: n-grams copied from the text so far", "early exit: the model's own first layers")
BOTH = "both examples: where drafting wins, beside where it loses"


def chat_ids(model, text: str) -> list[int]:
    """The prompt as the model was fine-tuned to see it (its chat template), or plain text for a base model."""
    tok = model.tokenizer
    if tok is not None and tok.has_chat_template:
        return list(tok.encode(tok.apply_chat_template([{"role": "user", "content": text}])))
    return model.encode_prompt(text)


def measured(model) -> None:
    st.subheader("On the engine: two kinds of draft")
    L = model.config.num_layers
    kind = st.radio("Draft", DRAFTS, key="spec.draft", horizontal=True)
    lookup = kind == DRAFTS[0]
    if lookup:
        st.markdown("**Prompt lookup** (vLLM's `ngram` method) needs no draft model: it finds the latest earlier "
                    "place where the last 1-3 tokens of the text occurred and proposes the K tokens that followed "
                    "there. Free to compute, and right whenever the reply repeats its input.")
        example = st.selectbox("Prompt", [BOTH, *LOOKUP_EXAMPLES, "your own"], key="spec.example")
        text = BOTH if example == BOTH else LOOKUP_EXAMPLES.get(example) or st.text_input(
            "Your prompt", "Repeat after me: to be or not to be", key="spec.own_prompt")
    else:
        st.markdown(f"The draft is the model's own first layers (the same embedding, final norm and output head), "
                    f"so it costs about layers ÷ {L} of a full step and shares every weight.")
        text = st.text_input("Prompt", "The capital of France is", key="spec.prompt")
    st.markdown("The full model checks the K guesses in one pass; greedy output must come out identical to plain "
                "decoding.")
    c = st.columns(3)
    layers = 0 if lookup else int_field("Draft layers", max(1, L // 4), 1, max(1, L - 1), key="spec.layers",
                                        where=c[0])
    k = int_field("Draft tokens K", 8 if lookup else 4, 1, 16, key="spec.lookup_k" if lookup else "spec.engine_k",
                  where=c[1])
    new = int_field("New tokens", 48 if lookup else 16, 1, 128, key="spec.lookup_new" if lookup else "spec.new",
                    where=c[2])
    if None in (layers, k, new):
        return
    if not text.strip():
        show_error("Type a prompt.")
        return
    cases = dict(LOOKUP_EXAMPLES) if text == BOTH else {"this prompt": text}
    try:
        ids = {label: chat_ids(model, t) if lookup else model.encode_prompt(t) for label, t in cases.items()}
        draft = PromptLookup() if lookup else early_exit_draft(model, layers)
    except SpecError as e:
        show_error(e)
        return
    out = measured_run(
        "speculative run", (model.source, kind, text, layers, k, new),
        lambda: measured_under_load(lambda: {label: speculative_run(model, draft, i, max_new_tokens=new,
                                                                    draft_tokens=k) for label, i in ids.items()},
                                        matrices=model.weight_matrices),
        model=model, tokens=max(map(len, ids.values())) + new + k, sequences=2,
        button="Run plain and speculative", button_key="spec.run", spinner="Decoding twice …",
        hint="Press Run to decode the prompt plainly and speculatively.")
    if out is None:
        return
    results, load = out
    notice = busy_notice(load.others, load.cores)
    if notice:
        st.warning(notice, icon=":material/warning:")
    for i, (label, r) in enumerate(results.items()):
        if len(results) > 1:
            st.markdown(f"#### {label}")
        st.markdown(speculative_words(label, r, notice is not None))
        show_result(r, k, lookup, model, layers, f"speculative_measured_{i}")
    if lookup:
        st.markdown(
            "**Why it wins or loses.** When the reply copies the prompt, the tokens after the last matching n-gram "
            "are what the model writes next, so most of the K drafts are accepted and one pass of the full model "
            "yields several tokens, while the drafts cost nothing to make. When the reply is new text, the n-grams "
            "rarely match: a round either proposes nothing (a plain decode step) or proposes tokens the model "
            "rejects, and each verification pass of K + 1 tokens costs more than a plain step, so it runs slower "
            "than plain decoding. The formula's α assumes every token is equally likely to be accepted; copying "
            "is all-or-nothing in runs, so measured tokens per pass can differ from it.")


def show_result(r: dict, k: int, lookup: bool, model, layers: int, name: str) -> None:
    (st.success if r["identical"] else st.error)(
        "Same tokens as plain greedy decoding." if r["identical"] else "Tokens differ from plain decoding!")
    alpha = r["alpha"]
    ok = not math.isnan(alpha)
    pred_tokens = expected_tokens_per_pass(alpha, k) if ok else float("nan")
    pred_speed = speculative_speedup(alpha, k, r["draft_cost_ratio"]) if ok and not math.isnan(
        r["draft_cost_ratio"]) else float("nan")
    c = st.columns(3)
    c[0].metric("Measured acceptance α", fmt_num(alpha, 3) if ok else "n/a",
                help=f"accepted / (accepted + rejections); raw accepted/proposed = {fmt_num(r['acceptance_rate'], 3)}")
    c[1].metric("Tokens per pass", fmt_num(r["tokens_per_pass"], 3), delta=f"formula {fmt_num(pred_tokens, 3)}",
                delta_color="off", delta_arrow="off")
    c[2].metric("Wall-time speedup", f"{fmt_num(r['speedup_measured'], 3)}×",
                delta=f"formula {fmt_num(pred_speed, 3)}×",
                delta_color="off", delta_arrow="off")
    given = "measured (an input of the formula)"
    df_with_download(pd.DataFrame([
        dict(quantity="tokens per target pass", measured=r["tokens_per_pass"], formula=fmt_num(pred_tokens, 3)),
        dict(quantity="speedup", measured=r["speedup_measured"], formula=fmt_num(pred_speed, 3)),
        dict(quantity="draft step ÷ target step", measured=r["draft_cost_ratio"], formula=given),
        dict(quantity="verification pass ÷ target step", measured=r["verify_cost_ratio"],
             formula="1 (the formula assumes one step)"),
        dict(quantity="plain decoding (s)", measured=r["plain_s"], formula=given),
        dict(quantity="speculative (s)", measured=r["speculative_s"], formula=given)]), name)
    st.caption(f"Formula with the measured α, K = {k} and the measured draft cost per step. "
               + formula_gap_words(r["speedup_measured"], pred_speed, r["verify_cost_ratio"]) + " "
               + ("" if lookup else acceptance_words(model, layers, alpha)))


def main() -> None:
    """The formula's inputs and its curve under the title (a projector's first screen at 1366×768), then the intro
    and the engine's two drafts."""
    setup_page("Speculative decoding", icon=":material/fast_forward:")
    st.title("Speculative decoding")
    top = st.container()
    st.markdown(
        "A decode step of a big model is paid mostly in weight reads, and checking five tokens costs about the "
        "same as producing one. So let a small, fast draft guess a few tokens ahead and have the big model check "
        "them all in one pass: every guess it agrees with is a token for free, and the first disagreement is "
        "replaced by the big model's own choice, so the output is exactly what it would have written.")
    with top:
        theory()
    engine_model = model_picker()
    if engine_model is not None:
        measured(engine_model)


main()
