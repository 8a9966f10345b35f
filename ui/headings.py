"""Human headings for a table's columns: the CSV keeps its identifiers (`itl_p99_at_load_ms`), the page draws
"ITL p99 at load (ms)". Words only, no Streamlit: `ui.widgets.df_with_download` applies it to every table."""
from __future__ import annotations

import re

ACRONYMS = {"itl": "ITL", "ttft": "TTFT", "kv": "KV", "tp": "TP", "pp": "PP", "ep": "EP", "dp": "DP", "gpu": "GPU",
            "gpus": "GPUs", "mbu": "MBU", "mfu": "MFU", "id": "ID", "ids": "IDs", "slo": "SLO", "tpot": "TPOT",
            "qps": "QPS", "moe": "MoE", "cpu": "CPU", "lm": "LM", "mla": "MLA", "gqa": "GQA", "mqa": "MQA",
            "mha": "MHA", "usd": "$", "rps": "requests/s", "mlp": "MLP", "ffn": "FFN", "rope": "RoPE"}
UNITS = {"ms": "ms", "s": "s", "us": "µs", "gb": "GB", "mb": "MB", "kb": "KB", "gib": "GiB", "bytes": "bytes",
         "pct": "%", "rps": "requests/s", "tflops": "TFLOP/s", "gflops": "GFLOP/s"}
MID_UNITS = ("ms", "us", "gb", "mb", "bytes")       # a unit inside a name moves to its end
RAW = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+")        # an identifier with at least one underscore


def _words(name: str) -> str:
    parts = re.sub(r"(^|_)tok_s(?=_|$)", r"\1tokens/s", name.lower()).split("_")
    unit = ""
    if len(parts) >= 3 and parts[-2:] == ["per", "s"]:
        parts, unit = parts[:-2], "/s"
    elif len(parts) >= 2 and parts[-1] in UNITS:
        parts, unit = parts[:-1], UNITS[parts[-1]]
    elif mid := [i for i, p in enumerate(parts[1:-1], 1) if p in MID_UNITS]:      # step_ms_at_load
        unit = UNITS[parts[mid[0]]]
        parts = parts[:mid[0]] + parts[mid[0] + 1:]
    words = []
    for i, p in enumerate(parts):
        if p == "million" and i > 0 and parts[i - 1] == "per":
            words.append("1M")
        elif p == "tok":
            words.append("tokens")
        else:
            words.append(ACRONYMS.get(p, p))
    text = " ".join(words)
    if unit == "/s":
        return f"{text}/s"
    return f"{text} ({unit})" if unit else text


def human_heading(name) -> str:
    """'itl_p99_at_load_ms' -> 'ITL p99 at load (ms)', 'output_tok_s' -> 'output tokens/s', 'kv_heads' -> 'KV heads',
    'usd_per_million_tokens' -> '$ per 1M tokens'; a heading without identifiers is returned as it is ('step',
    'TTFT (ms)'); identifiers inside a longer heading are rewritten in place ('offline · output_tok_s')."""
    text = str(name)
    return RAW.sub(lambda m: _words(m.group(0)), text)


def human_list(names) -> str:
    """Column names for a sentence ('Also in the CSV: ITL p99 at load (ms), peak allocated tokens')."""
    return ", ".join(human_heading(n) for n in names)
