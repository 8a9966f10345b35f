"""Command line: `python -m engine generate --model SOURCE --prompt TEXT --max-new-tokens N [--json]`,
`python -m engine serve [--model SOURCE] [--port 8000]` (the OpenAI-compatible server, `server/serve_cli.py`) and
`python -m engine export-hf OUT_DIR [--model SOURCE]` (a Hugging Face folder vLLM loads) and
`python -m engine profile [--backend numpy|torch] [--device cpu|cuda] [--budget-s 60] [--out PATH]` (a device
profile of this machine, `engine/instruments/profile_cli.py`) and
`python -m engine export-tokenizer OUT_DIR [--model SOURCE]` (the same folder without the weights: the tokenizer a
load tester such as guidellm, `vllm bench serve` or AIPerf loads offline).

Streams the reply as it is generated; `--json` prints one object with token ids, text, TTFT, per-token latency
and KV-cache bytes instead. A problem the user can fix prints one line on stderr and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine", description="Run a Llama-architecture model in NumPy.")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text from a prompt, streaming tokens")
    g.add_argument("--model", default=None,
                   help="smollm2 (default, offline) | path/to/model.gguf | HF folder | owner/repo | random:<preset>")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-ids", help="the prompt as token ids, e.g. '1 14350 263 5828' (models without a tokenizer)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0, help="0 = off")
    g.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--json", action="store_true", help="print a JSON summary instead of streaming text")
    from server.serve_cli import add_arguments
    add_arguments(sub.add_parser("serve", help="serve the model over HTTP: OpenAI API, /metrics, the live batch"))
    e = sub.add_parser("export-hf", help="write the model as a Hugging Face folder (for vLLM, transformers)")
    e.add_argument("out_dir", help="folder to write config.json, model.safetensors and the tokenizer files into")
    e.add_argument("--model", default=None, help="the model to export (default: the bundled SmolLM2)")
    from engine.instruments.profile_cli import add_arguments as add_profile_arguments
    add_profile_arguments(sub.add_parser("profile", help="measure this machine op by op: a device profile"))
    t = sub.add_parser("export-tokenizer", help="write the model's tokenizer (and config.json, no weights) as a "
                       "Hugging Face folder, for a load tester's --tokenizer")
    t.add_argument("out_dir", help="folder to write config.json and the tokenizer files into")
    t.add_argument("--model", default=None, help="the model whose tokenizer to export (default: the bundled SmolLM2)")
    return p


def _export_hf(args) -> int:
    from engine import load_model
    from engine.load.hf_export import export_hf, export_tokenizer
    model = load_model(args.model)
    if args.command == "export-tokenizer":
        out = export_tokenizer(model, args.out_dir)
        print(f"wrote {model.name}'s tokenizer (no weights) to {out}")
    else:
        out = export_hf(model, args.out_dir)
        print(f"wrote {model.name} (float32) to {out}")
    return 0


def _generate(args) -> int:
    from engine import load_model
    from engine.model.generate import generation_summary

    def progress(frac: float, msg: str) -> None:
        if not args.json and sys.stderr.isatty():
            print(f"\r[{frac * 100:5.1f}%] {msg}"[:120].ljust(120), end="", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    model = load_model(args.model, progress=progress)
    load_s = time.perf_counter() - t0
    if not args.json:
        print(f"\rloaded {model.name} in {load_s:.1f} s".ljust(120), file=sys.stderr)
    prompt = args.prompt
    if args.prompt_ids is not None:
        from engine.errors import ModelError
        try:
            prompt = [int(t) for t in args.prompt_ids.replace(",", " ").split()]
        except ValueError:
            raise ModelError("--prompt-ids must be whole numbers separated by spaces") from None
    elif args.chat:
        if model.tokenizer is None or not model.tokenizer.has_chat_template:
            from engine.errors import ModelError
            raise ModelError(f"{model.name} has no chat template; drop --chat")
        prompt = model.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    prompt_ids = model.encode_prompt(prompt)
    tokens = model.generate(prompt_ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                            top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    generated = []
    for tok in tokens:
        generated.append(tok)
        if not args.json:
            print(tok.text, end="", flush=True)
    ids = [t.token_id for t in generated]
    lat, kv, finish = [t.seconds for t in generated], generated[-1].kv_cache_bytes, generated[-1].finish_reason
    summary = generation_summary(generated)
    if args.json:
        print(json.dumps({
            "model": model.name, "source": model.source, "random_weights": model.random_weights,
            "prompt_token_ids": prompt_ids, "token_ids": ids, "text": "".join(t.text for t in generated),
            "load_s": round(load_s, 3), "ttft_ms": round(lat[0] * 1e3, 3),
            "itl_ms": [round(s * 1e3, 3) for s in lat[1:]], "kv_cache_bytes": kv, "finish_reason": finish,
        }, ensure_ascii=False))
    else:
        print(f"\n\n[{len(ids)} tokens · TTFT {summary['ttft_ms']:.0f} ms · ITL {summary['mean_itl_ms']:.1f} ms · "
              f"KV cache {kv / 1e6:.2f} MB · stop: {finish}]", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    from specs.model_config import SpecError
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            from server.serve_cli import run
            return run(args)
        if args.command in ("export-hf", "export-tokenizer"):
            return _export_hf(args)
        if args.command == "profile":
            from engine.instruments.profile_cli import run as profile
            return profile(args)
        return _generate(args)
    except SpecError as e:                      # ModelError is a SpecError: a problem the user can fix
        print(f"\nerror: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
