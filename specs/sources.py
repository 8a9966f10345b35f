"""Sources a reader can open. Calculators cite the curriculum by short codes ("003 Detail 18", "reference 000");
`readable_source` turns every such code inside a text into the document's title and the section's heading, with a
link where the document has a public address, at display time (so docstrings keep their short codes).

    readable_source("003 Detail 18 (scales per group)")
    -> '"LLM Inference: From Black Box to Production", section "Detail 18: Quantization" (vinitvyas.com)
        (scales per group)'
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Reference:
    title: str
    what: str                 # one line: what the document is
    url: str | None = None    # where a reader can open it (None: not published at a known address)


REFERENCES: dict[str, Reference] = {
    "000": Reference("Transformer Architecture (Llama 3 70B, op by op)",
                     "every tensor shape of Llama 3 70B's prefill and decode"),
    "001": Reference("Llama3-70B Galaxy: Prefill Operations Detailed Report",
                     "prefill of Llama 3 70B sharded over a 32-device mesh"),
    "002": Reference("Gated delta-rule attention: prefill and decode",
                     "linear attention with a fixed-size recurrent state"),
    "003": Reference("LLM Inference: From Black Box to Production",
                     "the main text, TinyLlama-1.1B as the running example", "https://vinitvyas.com/"),
    "004": Reference("The Prefill Phase (Akunu inference engine book)",
                     "GEMM vs GEMV, chunked prefill, scratch buffers, last-position logits"),
}
# The main text's section headings ("Detail N: heading").
DETAILS_003: dict[str, str] = {
    "1": "Tokens", "2a": "Embeddings", "2b": "Unembeddings", "3": "Autoregressive Generation",
    "4": "Self-Attention", "5": "Multi-Head Attention", "6": "Attention Variants (GQA, SWA, MLA)",
    "7": "Positional Encodings with RoPE", "8": "Feed-Forward Network (FFN)", "9": "The Complete Transformer Block",
    "10": "The KV Cache", "11": "Prefill vs Decode", "12": "Memory Bandwidth is the Bottleneck",
    "13": "Batching Requests", "14": "Continuous (In-Flight) Batching", "15": "The KV Cache Memory Problem",
    "16": "PagedAttention (vLLM's Innovation)", "17": "FlashAttention", "18": "Quantization",
    "19": "Speculative Decoding", "20": "Prefix Caching", "21": "Latency vs Throughput Trade-offs",
    "22": "Multi-GPU Inference",
}

_SECTION = r"\d{1,2}[ab]?"
_SECTIONS = rf"{_SECTION}(?:\s*(?:,|/|and|-|–)\s*{_SECTION})*"
# "003 Detail 18", "003, Detail 2a", "003 Details 11-13 and 21", "reference 000", "references 000" (not "1,000").
_CODE = re.compile(
    rf"(?<![\d,.])(?:(?P<ref>references?)\s+)?(?P<code>00[0-4])(?![\d,.]\d)"
    rf"(?:,?\s+(?P<word>Details?)\s+(?P<sections>{_SECTIONS}))?"
)


def section_numbers(spec: str) -> list[str]:
    """"11-13 and 21" -> ["11", "12", "13", "21"]; "2a / 18" -> ["2a", "18"]."""
    out: list[str] = []
    for part in re.split(r"\s*(?:,|/|and)\s*", spec.strip()):
        m = re.fullmatch(r"(\d+)\s*[-–]\s*(\d+)", part)
        if m:
            out += [str(i) for i in range(int(m.group(1)), int(m.group(2)) + 1)]
        elif part:
            out.append(part)
    return out


def describe(code: str, sections: list[str] | None = None, markdown: bool = True) -> str:
    """Title (linked when it has an address) and the named sections of one reference."""
    ref = REFERENCES[code]
    title = f'"{ref.title}"'
    if ref.url and markdown:
        title = f"[{title}]({ref.url})"
    elif ref.url:
        title += f" ({ref.url})"
    if not sections:
        return title
    names = [f'"Detail {s}: {DETAILS_003[s]}"' if code == "003" and s in DETAILS_003 else f"section {s}"
             for s in sections]
    word = "section" if len(names) == 1 else "sections"
    return f"{title}, {word} {', '.join(names)}"


def readable_source(text: str, markdown: bool = True) -> str:
    """Every short reference code in `text` replaced by what a reader can open (title, section, link)."""
    def repl(m: re.Match) -> str:
        if not m.group("ref") and not m.group("word"):
            return m.group(0)                        # a bare "003" is too likely to be part of something else
        sections = section_numbers(m.group("sections")) if m.group("sections") else None
        return describe(m.group("code"), sections, markdown)

    return _CODE.sub(repl, text)
