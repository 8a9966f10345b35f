"""Mutation gate: every small bug on this list, planted in engine/ or calculators/, must make a default test fail.

Each mutation is (name, file, [(exact old snippet, new snippet), ...], why a user would be misled, tests to run).
The gate copies the repository's tracked files to a temporary folder, plants ONE mutation there (the working tree is
never touched), runs `pytest -x` on that mutation's tests (no torch needed: the default run) and reports
killed (a test failed, named) or SURVIVED. A snippet that is not found exactly once is an error, never a skip: when
the code it targets changes, the mutation must be re-targeted.

    python tools/mutation_gate.py                 # all mutations; exit 1 if any survives or cannot be planted
    python tools/mutation_gate.py --list          # names and reasons only
    python tools/mutation_gate.py gqa_grouping_swapped rope_freqs_ignored      # some of them

Before the mutants, each distinct test selection runs once unmutated and must pass (else a "kill" means nothing).
A full run takes about 8 minutes on 2 busy cores (47 mutants, 7-11 s each, plus the baselines).
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TVE = "tests/test_theory_vs_experiment.py"
GOLD = "tests/engine/test_golden_logits.py"
FWD = "tests/engine/test_forward.py"
LOAD = ("tests/engine/test_loading.py", "-k", "gguf or rope")


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    edits: tuple[tuple[str, str], ...]
    why: str
    tests: tuple[str, ...]


def m(name: str, file: str, edits, why: str, *tests) -> Mutation:
    """tests: pytest arguments; a tuple among them is spread (a file with its -k filter)."""
    if isinstance(edits[0], str):
        edits = (edits,)
    args = tuple(a for t in tests for a in (t if isinstance(t, tuple) else (t,)))
    return Mutation(name, file, tuple(tuple(e) for e in edits), why, args)


MUTATIONS = [
    # ------------------------------------------------------------------ engine: counters (theory = experiment)
    m("trace_attention_flops_zeroed", "engine/model/forward.py",
      ("p.trace.add(\"attention\", li, flops=2 * 2.0 * d * h_q", "p.trace.add(\"attention\", li, flops=0 * 2.0 * d * h_q"),
      "the engine would report prefill as projection-only work: attention cost vanishes from every page", TVE),
    m("trace_norms_and_embedding_rows_dropped", "engine/model/forward.py",
      (("p.trace.add(\"embedding\", None, weight_bytes=p.rows * D * 4,",
        "p.trace.add(\"embedding\", None, weight_bytes=0,"),
       ("p.trace.add(\"attn_norm\", li, weight_bytes=D * 4,", "p.trace.add(\"attn_norm\", li, weight_bytes=0,"),
       ("p.trace.add(\"ffn_norm\", li, weight_bytes=D * 4,", "p.trace.add(\"ffn_norm\", li, weight_bytes=0,"),
       ("p.trace.add(\"final_norm\", None, weight_bytes=c.hidden_size * 4,",
        "p.trace.add(\"final_norm\", None, weight_bytes=0,")),
      "bytes read per token under-counted: the measured side of 'theory = experiment' silently shrinks", TVE),
    m("trace_kv_write_factor_2_dropped", "engine/model/forward.py",
      ("kv_write_bytes=float(p.rows * 2 * kv_dim * 4)", "kv_write_bytes=float(p.rows * kv_dim * 4)"),
      "K and V: counting one of them halves the KV traffic a student sees", TVE),
    m("trace_kv_read_off_by_one", "engine/model/forward.py",
      ("kv_read_bytes=float(ctx.sum() * 2 * kv_dim * 4)", "kv_read_bytes=float((ctx - 1).sum() * 2 * kv_dim * 4)"),
      "the new token's own key left out of the bytes read", TVE),
    m("trace_lm_head_all_rows", "engine/model/forward.py",
      ("out_rows = p.rows if all_logits else B", "out_rows = p.rows"),
      "prefill would count LM-head FLOPs for every prompt position though only the last one is computed", TVE),
    # ------------------------------------------------------------------ engine: the forward pass
    m("gqa_grouping_swapped", "engine/model/forward.py",
      ("qg = q.reshape(B, T, h_kv, c.group_size, d).transpose(0, 2, 3, 1, 4)",
       "qg = q.reshape(B, T, c.group_size, h_kv, d).transpose(0, 3, 2, 1, 4)"),
      "query heads attend to the wrong K/V head: GQA models produce fluent-looking nonsense", GOLD),
    m("block_path_mask_removed", "engine/model/forward.py",
      ("np.copyto(scores, -np.inf, where=hidden)", "pass"),
      "attention would see the future and the padding (no causal mask)", GOLD),
    m("later_block_mask_uses_first_block_positions", "engine/model/forward.py",
      ("q = self.positions[:, start:end]", "q = self.positions[:, :end - start]"),
      "prompts over 512 tokens: the second query block masked as if it were the first", GOLD),
    m("attention_scale_wrong", "engine/model/forward.py",
      ("scale = 1.0 / math.sqrt(p.config.query_pre_attn_scalar or q.shape[-1])",
       "scale = 1.0 / (p.config.query_pre_attn_scalar or q.shape[-1])"),
      "softmax temperature off by sqrt(d): attention maps on the pages would be too flat", GOLD),
    m("causal_mask_excludes_self", "engine/model/ops.py",
      ("return (keys[None, None, :] <= q_positions[:, :, None]) & key_valid[:, None, :]",
       "return (keys[None, None, :] < q_positions[:, :, None]) & key_valid[:, None, :]"),
      "a token could not attend to itself (off by one in the causal mask)", GOLD),
    m("rms_norm_mean_off_by_one", "engine/model/ops.py",
      ("np.float32(1.0 / D)", "np.float32(1.0 / (D - 1))"),
      "RMSNorm dividing by D-1: every activation slightly mis-scaled", GOLD),
    m("few_rows_matvecs_need_an_lm_head_sized_matrix", "engine/model/ops.py",
      ("return W.nbytes >= (MATVEC_FEW_MIN_BYTES if rows <= MATVEC_FEW_ROWS else MATVEC_MIN_BYTES)",
       "return W.nbytes >= MATVEC_MIN_BYTES"),
      "2-3 decode streams would multiply every layer with OpenBLAS's GEMM again (~1.3x slower products)",
      "tests/engine/test_matmul_t.py"),
    m("rms_norm_one_row_without_eps", "engine/model/ops.py",
      ("float(row @ row) / D + eps", "float(row @ row) / D"),
      "a decode step's RMSNorm without its epsilon: prefill and decode would normalise differently",
      "tests/engine/test_ops.py"),
    m("softmax_all_hidden_row_not_guarded", "engine/model/ops.py",
      ("        np.maximum(m, F32_MIN, out=m)", "        pass"),
      "a row whose keys are all hidden (padding) would turn into NaN and spread through the batch",
      "tests/engine/test_ops.py"),
    m("swiglu_sigmoid_sign_flipped", "engine/model/ops.py",
      ("    out = np.negative(gate)\n", "    out = gate.copy()\n"),
      "SwiGLU gate inverted", GOLD),
    m("rope_rotation_sign_flipped", "engine/model/ops.py",
      ("full, signed = np.concatenate([cos, cos], axis=-1), np.concatenate([-sin, sin], axis=-1)",
       "full, signed = np.concatenate([cos, cos], axis=-1), np.concatenate([sin, -sin], axis=-1)"),
      "RoPE rotating the wrong way: positions encoded backwards", GOLD),
    m("rope_interleaved_pairs_itself", "engine/model/ops.py",
      ("partner = np.arange(2 * h) ^ 1", "partner = np.arange(2 * h)"),
      "GGUF-layout RoPE pairing each dimension with itself: every Llama GGUF decodes garbage",
      "tests/engine/test_ops.py", LOAD),
    m("llama3_long_waves_not_slowed", "engine/model/ops.py",
      ("out = np.where(wavelen > old_ctx / low, inv / factor, inv)",
       "out = np.where(wavelen > old_ctx / low, inv, inv)"),
      "Llama-3.1 context extension ignored for long wavelengths", GOLD),
    m("rope_freqs_ignored", "engine/load/gguf_loader.py",
      ("freqs = dequantize_tensor(names[ROPE_FREQS], p) if ROPE_FREQS in names else None", "freqs = None"),
      "Llama-3.1/3.2 GGUFs run with plain RoPE: wrong logits past the original context", LOAD),
    m("gguf_k_unpermuted_with_query_heads", "engine/load/gguf_loader.py",
      ("w = _unpermute_checked(w, config.num_kv_heads, gname, p)", "w = _unpermute_checked(w, config.num_heads, gname, p)"),
      "GQA GGUF keys un-permuted per query head: wrong RoPE pairs", LOAD),
    m("kv_cache_bytes_used_k_only", "engine/model/kv_cache.py",
      ("return [int(2 * int(self.held(l).sum()) * h_kv * d * k.itemsize)",
       "return [int(int(self.held(l).sum()) * h_kv * d * k.itemsize)"),
      "the KV-cache size shown after each token would be half the real one", TVE),
    # ------------------------------------------------------------------ engine: generation
    m("context_check_loosened", "engine/model/stopping.py",
      ("if cached_tokens >= context_tokens:", "if cached_tokens > context_tokens:"),
      "a sequence at the context window would be fed one more token than the model has positions for", FWD,
      "tests/engine/test_stopping.py"),
    m("batch_finished_rows_keep_decoding", "engine/model/generate.py",
      ("if len(keep) < len(rows):", "if False:"),
      "finished rows keep generating (wasted work, wrong tokens appended)", FWD),
    m("batch_rows_share_one_seed", "engine/model/generate.py",
      ("return [None if seed is None else int(seed) + b for b in range(batch)]",
       "return [None if seed is None else int(seed) for b in range(batch)]"),
      "every row of a sampled batch would draw the same random stream", FWD),
    m("top_p_keeps_one_token_too_few", "engine/model/sampling.py",
      ("keep = cum - p[order] < top_p", "keep = cum < top_p"),
      "nucleus sampling would drop the token that crosses p", "tests/engine/test_sampling.py"),
    # ------------------------------------------------------------------ calculators
    m("kv_per_token_factor_2_dropped", "calculators/sizing/kv_cache.py",
      ("    return 2 * config.kv_dim\n", "    return config.kv_dim\n"),
      "KV cache sized for K only: every fit verdict too optimistic", "tests/calculators/test_kv_cache.py"),
    m("roofline_attention_flops_halved", "calculators/sizing/roofline.py",
      ("flops=2.0 * B * T * Skeep * d * hq, act_read_bytes=R * qd * ab,",
       "flops=1.0 * B * T * Skeep * d * hq, act_read_bytes=R * qd * ab,"),
      "the theory's attention FLOPs a factor 2 short", TVE, "tests/calculators/test_roofline.py"),
    m("roofline_norm_weights_dropped", "calculators/sizing/roofline.py",
      ("return _ew(name, R, width, ab, flops_per_elem=4.0, weight_bytes=nw * wb, layer_kind=layer_kind)",
       "return _ew(name, R, width, ab, flops_per_elem=4.0, weight_bytes=0, layer_kind=layer_kind)"),
      "the theory's bytes per token leave out the norm vectors", TVE, "tests/calculators/test_roofline.py"),
    m("decode_floor_without_kv", "calculators/sizing/latency.py",
      ("return dict(weights=w, kv_read=kv[\"read\"], kv_written=kv[\"written\"], total=w + kv[\"read\"] + kv[\"written\"])",
       "return dict(weights=w, kv_read=kv[\"read\"], kv_written=kv[\"written\"], total=w)"),
      "long-context ITL predicted as if the KV cache cost nothing to read", "tests/calculators/test_explain.py",
      "tests/calculators/test_latency.py"),
    m("engine_floor_without_kv_written", "calculators/sizing/engine_floor.py",
      ("total=weights + kv[\"read\"] + kv[\"written\"])", "total=weights + kv[\"read\"])"),
      "the engine's ITL floor would no longer equal what its Trace counts", TVE),
    m("tied_head_counted_twice", "calculators/sizing/params.py",
      ("lm_head = 0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size",
       "lm_head = c.vocab_size * c.hidden_size"),
      "tied models (SmolLM2, Gemma) sized with a second embedding table", "tests/calculators/test_params.py",
      "tests/specs/test_specs.py"),
    m("fits_comparison_loosened", "calculators/sizing/memory.py",
      ("usable_bytes=usable, fits=needed <= usable,", "usable_bytes=usable, fits=needed <= 2 * usable,"),
      "models twice the GPU's memory reported as fitting", "tests/calculators/test_memory.py"),
    m("flash_tiled_blocks_floor", "calculators/sizing/flash_attention.py",
      ("blocks = math.ceil(seq_len / check_int(\"block_q\", block_q))",
       "blocks = seq_len // check_int(\"block_q\", block_q)"),
      "a partial last query block would read no K/V: tiled traffic under-counted", "tests/calculators/test_flash_attention.py"),
    m("int8_scale_off_by_one", "calculators/sizing/quantization.py",
      ("return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1", "return -(2 ** (bits - 1)), 2 ** (bits - 1)"),
      "INT8 codes up to 128 that do not exist: the walk-through's q and error wrong", "tests/calculators/test_quantization.py"),
    m("matvecs_all_rows_into_the_first", "engine/model/ops.py",
      ("np.matmul(block, row, out=out[r, s:s + step])", "np.matmul(block, row, out=out[0, s:s + step])"),
      "two to four streams decoding together would get one stream's projections: wrong text for all but one",
      "tests/engine/test_matmul_t.py", "tests/engine/test_scheduler.py"),
    m("head_bytes_relabelled", "engine/model/model.py",
      ("head = by_columns(self.lm_head)", "head = np.ascontiguousarray(self.lm_head.T).reshape(self.lm_head.shape)"),
      "the LM head's transposed bytes read back as [V, D]: every logit wrong (the classic layout slip)",
      "tests/engine/test_forward.py", "tests/engine/test_golden_logits.py"),
    m("by_columns_every_block_from_the_first", "engine/model/model.py",
      ("out[:, i:i + block_rows] = a[i:i + block_rows].T", "out[:, i:i + block_rows] = a[:block_rows].T"),
      "an LM head past 256 rows copied from its first block: every later token's logit wrong",
      "tests/engine/test_forward.py"),
    m("tied_head_copied", "engine/model/model.py",
      ("embed = head if self.lm_head is self.embed else self.embed", "embed = self.embed"),
      "a tied model would keep its embedding table twice (SmolLM2: 113 MB more for every user)",
      "tests/engine/test_forward.py"),
    m("by_columns_product_untransposed", "engine/model/ops.py",
      ("        out = rows @ W.T                                                            # Wᵀ is a contiguous [in, out]",
       "        out = np.ascontiguousarray(W @ rows.T).reshape(rows.shape[0], -1)          # Wᵀ is a contiguous [in, out]"),
      "the by-columns product's [out, M] result read as [M, out]: batched rows would get each other's logits",
      "tests/engine/test_matmul_t.py"),
    m("prefix_hash_without_parent", "engine/serve/block_manager.py",
      ("return hash((parent, tuple(int(t) for t in tokens)))", "return hash((None, tuple(int(t) for t in tokens)))"),
      "a block whose tokens appeared at another position after another prefix would be reused with the wrong K/V",
      "tests/engine/test_scheduler.py"),
    m("preempt_the_oldest", "engine/serve/scheduler.py",
      ("victim = self.running[-1]", "victim = self.running[0]"),
      "the request that did the most work would be thrown away first (docs/engine.md promises the newest)",
      "tests/engine/test_scheduler.py"),
    m("paged_read_blocks_and_heads_swapped", "engine/serve/paged_cache.py",
      ("x = pool[g[:, None, :], heads].reshape(B, h_kv, nb * self.block_size, d)",
       "x = pool[g[:, :, None], heads.reshape(1, 1, -1)].reshape(B, h_kv, nb * self.block_size, d)"),
      "attention would read each head's keys from the wrong blocks: served text differs from the plain engine",
      "tests/engine/test_paged_cache.py"),
    m("paged_write_slots_kept_across_passes", "engine/serve/paged_cache.py",
      ("        self._slots_for = None\n", "        pass\n"),
      "a decode step would write its K/V over the previous step's slots: the cache forgets tokens",
      "tests/engine/test_paged_cache.py", "tests/engine/test_scheduler.py"),
    m("requests_run_first_prompt_for_all", "engine/serve/serving_runs.py",
      ("requests = [s.submit(p, max_new_tokens=new_tokens, stop_at_eos=False) for p in prompts]",
       "requests = [s.submit(prompts[0], max_new_tokens=new_tokens, stop_at_eos=False) for p in prompts]"),
      "the bench against vLLM and the Batching page would time one prompt copied N times, not the N prompts",
      "tests/engine/test_serving_runs.py"),
    m("paging_blocks_floor", "calculators/serving/paging.py",
      ("return math.ceil(check_int(\"tokens\", tokens, minimum=0) / check_int(\"block_size\", block_size))",
       "return check_int(\"tokens\", tokens, minimum=0) // check_int(\"block_size\", block_size)"),
      "a partly filled last block not allocated: paged memory under-counted", "tests/calculators/test_serving_curriculum.py"),
    m("speculative_sum_off_by_one", "calculators/serving/speculative.py",
      ("return (1 - acceptance ** (k + 1)) / (1 - acceptance)", "return (1 - acceptance ** k) / (1 - acceptance)"),
      "speculative decoding's tokens per pass would miss the bonus token", "tests/calculators/test_serving_curriculum.py"),
    m("queue_wait_without_rho", "calculators/serving/queueing.py",
      ("return rho / (1 - rho)", "return 1 / (1 - rho)"),
      "queueing delay at low load overstated (M/M/1 wait factor wrong)", "tests/calculators/test_serving_curriculum.py"),
]


def copy_repo(dest: Path) -> None:
    """The tracked and untracked-but-not-ignored files of the repository (what CI's clone would hold)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split("\n")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file() and not src.is_symlink():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)


def plant(tree: Path, mut: Mutation, dry_run: bool = False) -> None:
    path = tree / mut.file
    text = path.read_text()
    for old, new in mut.edits:
        n = text.count(old)
        if n != 1:
            raise SystemExit(f"mutation {mut.name}: snippet found {n} times in {mut.file} (must be exactly once); "
                             f"re-target it to the current code:\n    {old}")
        text = text.replace(old, new)
    if not dry_run:
        path.write_text(text)


def run_tests(tree: Path, tests: tuple[str, ...], timeout: int) -> tuple[bool, str, float]:
    """(passed, first failing test or '', seconds)."""
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                           cwd=tree, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"(timed out after {timeout} s)", time.perf_counter() - t0
    out = r.stdout + r.stderr
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
    return r.returncode == 0, (failed[0] if failed else out.strip().splitlines()[-1] if out.strip() else ""), \
        time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="run only these mutations")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per pytest run")
    args = ap.parse_args()
    muts = [x for x in MUTATIONS if not args.names or x.name in args.names]
    unknown = set(args.names) - {x.name for x in MUTATIONS}
    if unknown:
        raise SystemExit(f"unknown mutations: {sorted(unknown)}")
    if args.list:
        for x in muts:
            print(f"{x.name:<40} {x.file:<30} {x.why}")
        return 0
    with tempfile.TemporaryDirectory(prefix="mutation-gate-") as tmp:
        clean = Path(tmp) / "clean"
        copy_repo(clean)
        for x in muts:                                  # every snippet must be plantable before anything runs
            plant(clean, x, dry_run=True)
        for tests in sorted({x.tests for x in muts}):
            ok, failing, secs = run_tests(clean, tests, args.timeout)
            if not ok:
                raise SystemExit(f"unmutated code fails {' '.join(tests)} ({failing}); fix that first")
            print(f"baseline passes: {' '.join(tests)} ({secs:.0f} s)", flush=True)
        rows, survived = [], 0
        for x in muts:
            tree = Path(tmp) / x.name
            shutil.copytree(clean, tree)
            plant(tree, x)
            ok, failing, secs = run_tests(tree, x.tests, args.timeout)
            shutil.rmtree(tree)
            survived += ok
            rows.append((x.name, x.file, "SURVIVED" if ok else "killed", failing if not ok else "-", secs))
            print(f"{'SURVIVED' if ok else 'killed  '} {x.name:<40} {secs:5.0f} s  {failing if not ok else ''}",
                  flush=True)
    print(f"\n| mutation | file | result | killed by |\n|---|---|---|---|")
    for name, file, result, by, _ in rows:
        print(f"| {name} | {file} | {result} | {by} |")
    print(f"\n{len(rows) - survived} of {len(rows)} mutants killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
