"""The paged KV cache gives the same logits as the contiguous one; blocks are counted, shared and evicted right."""
import math

import numpy as np
import pytest

from engine import BlockManager, Model, ModelError, PagedKVCache
from engine.serve.block_manager import OutOfBlocks
from helpers_models import prompt, tiny

# float32 logits of the same computation; the only difference is the gathered (copied) K/V and, for ragged
# batches, the number of masked keys: sums may be reordered, ~1e-7 relative on O(1) logits. 1e-5 is the bound
# test_engine_forward uses for the same forward pass.
TOL = 1e-5


@pytest.fixture(scope="module")
def model():
    return Model.random(tiny(), seed=3)


def paged(model, num_blocks=64, block_size=4, batch=1, **kw):
    return PagedKVCache.for_model(model, num_blocks=num_blocks, block_size=block_size, batch=batch, **kw)


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
def test_paged_prefill_and_decode_equal_contiguous(model, block_size):
    ids = prompt(23, seed=1)
    full = model.logits(ids)                                         # contiguous cache, one pass
    cache = paged(model, block_size=block_size)
    last = model.forward(np.array([ids[:9]]), cache)[0]
    assert np.abs(last - full[8]).max() < TOL
    for i in range(9, 23):
        step = model.forward(np.array([[ids[i]]]), cache)[0]
        assert np.abs(step - full[i]).max() < TOL
    assert len(cache.tables[0]) == math.ceil(23 / block_size)


@pytest.mark.parametrize("chunk", [1, 4, 7])
def test_paged_chunked_prefill_equals_contiguous(model, chunk):
    ids = prompt(19, seed=2)
    full = model.logits(ids)
    cache = paged(model, block_size=4)
    for s in range(0, 19, chunk):
        part = ids[s:s + chunk]
        out = model.forward(np.array([part]), cache, all_logits=True)[0]     # [len(part), V]
        assert np.abs(out[:len(part)] - full[s:s + len(part)]).max() < TOL


def test_paged_ragged_batch_equals_contiguous_batch(model):
    seqs = [prompt(n, seed=n) for n in (5, 13, 9)]
    B, T = len(seqs), max(map(len, seqs))
    tokens = np.array([s + [0] * (T - len(s)) for s in seqs])          # left-aligned, padded with 0
    n_valid = [len(s) for s in seqs]
    contiguous, pag = model.new_cache(B), paged(model, batch=B, block_size=4)
    a = model.forward(tokens, contiguous, n_valid=n_valid)
    b = model.forward(tokens, pag, n_valid=n_valid)
    assert np.abs(a - b).max() < TOL
    # then ragged again: rows feed 1, 3 and 2 tokens from their own positions
    more = np.array([[7, 0, 0], [8, 9, 10], [11, 12, 0]])
    a = model.forward(more, contiguous, n_valid=[1, 3, 2], all_logits=True)
    b = model.forward(more, pag, n_valid=[1, 3, 2], all_logits=True)
    for row, n in enumerate([1, 3, 2]):
        assert np.abs(a[row, :n] - b[row, :n]).max() < TOL
    # every cached key sits where the block table says: brute force over all positions, layer 0 and the last
    for row in range(B):
        for pos in range(int(pag.lengths[row])):
            block, off = pag.tables[row][pos // 4], pos % 4
            for layer in (0, model.config.num_layers - 1):
                assert np.array_equal(pag.k[layer][block, :, off], contiguous.k[layer][row, :, pos])
                assert np.array_equal(pag.v[layer][block, :, off], contiguous.v[layer][row, :, pos])


@pytest.mark.parametrize("tokens", [1, 4, 5, 17, 32])
def test_paged_waste_is_at_most_block_size_minus_one(model, tokens):
    cache = paged(model, block_size=8)
    model.forward(np.array([prompt(tokens)]), cache)
    blocks = len(cache.tables[0])
    assert blocks == -(-tokens // 8)                   # ⌈n/B⌉, integer ceiling written another way
    assert cache.waste_slots(0) == blocks * 8 - tokens <= 7
    assert cache.blocks.num_used == blocks
    contiguous = model.new_cache(1, tokens)
    model.forward(np.array([prompt(tokens)]), contiguous)
    assert cache.bytes_used() == contiguous.bytes_used() == contiguous.bytes_reserved()
    assert cache.bytes_reserved() == contiguous.bytes_used() // tokens * blocks * 8     # whole blocks


def test_pool_too_small_raises_and_free_returns_every_block(model):
    cache = paged(model, num_blocks=3, block_size=4)
    with pytest.raises(OutOfBlocks, match="free"):
        model.forward(np.array([prompt(13)]), cache)                # needs 4 blocks of 4
    assert cache.blocks.num_free == 3                               # checked before taking any block
    model.forward(np.array([prompt(12)]), cache)
    assert cache.blocks.num_free == 0
    cache.free()
    assert cache.blocks.num_free == 3
    cache.blocks.check_invariants()


def test_paged_cache_refuses_positions_past_the_context(model):
    cache = paged(model, num_blocks=64, block_size=4)
    ctx = model.config.max_position_embeddings
    model.forward(np.array([prompt(ctx)]), cache)
    with pytest.raises(ModelError, match="context window"):
        model.forward(np.array([[5]]), cache)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_bad_block_size_or_pool_size_is_refused(model, bad):
    with pytest.raises(ModelError, match="block_size"):
        BlockManager(8, bad)
    with pytest.raises(ModelError, match="num_blocks"):
        BlockManager(bad, 4)


# ------------------------------------------------------------------------------------------------ block manager
def test_reference_counts_and_the_free_queue():
    bm = BlockManager(4, 2)
    a, b = bm.allocate(), bm.allocate()
    assert (a, b) == (0, 1) and bm.num_free == 2
    bm.share(a)
    bm.release(a)
    assert bm.num_free == 2                     # still held once
    bm.release(a)
    bm.release(b)
    assert bm.num_free == 4
    with pytest.raises(ModelError, match="released more"):
        bm.release(a)
    bm.check_invariants()


def test_prefix_lookup_follows_the_chain_of_full_blocks():
    bm = BlockManager(8, 2, prefix_caching=True)
    table, parent = [], None
    for i, toks in enumerate([(1, 2), (3, 4), (5, 6)]):
        table.append(bm.allocate())
        parent = bm.register(table[-1], parent, toks)
    assert bm.lookup([1, 2, 3, 4, 5, 6, 7], max_tokens=7) == table
    assert bm.lookup([1, 2, 3, 4, 9, 9], max_tokens=6) == table[:2]       # diverges in block 2
    assert bm.lookup([9, 2, 3, 4], max_tokens=4) == []                   # same block 1, different prefix
    assert bm.lookup([1, 2, 3, 4, 5, 6], max_tokens=5) == table[:2]      # never past max_tokens
    assert BlockManager(8, 2).lookup([1, 2], 2) == []                     # prefix caching off


def test_unreferenced_cached_blocks_are_evicted_least_recently_used_first():
    bm = BlockManager(4, 1, prefix_caching=True, prefix_cache_blocks=2)
    blocks = [bm.allocate() for _ in range(3)]
    hashes = [bm.register(b, None, (t,)) for b, t in zip(blocks, (10, 11, 12))]
    for b in blocks:                                   # released in order 10, 11, 12: 10 is the oldest
        bm.release(b)
    assert bm.num_free == 4                            # cached but unreferenced blocks count as free
    assert bm.lookup([10], 1) == [] and bm.evictions == 1          # the budget of 2 pushed out the oldest
    assert bm.lookup([11], 1) == [blocks[1]] and bm.lookup([12], 1) == [blocks[2]]
    bm.share(blocks[1])                               # 11 is used again: no longer evictable
    bm.release(blocks[1])                             # ... and now the most recent
    taken = [bm.allocate() for _ in range(3)]          # 2 empty blocks, then evict the LRU cached one (12)
    assert blocks[2] in taken and bm.lookup([12], 1) == [] and bm.lookup([11], 1) == [blocks[1]]
    assert hashes[0] != hashes[1]
    bm.check_invariants()


def test_copy_on_write_gives_a_private_copy_with_the_same_kv(model):
    cache = paged(model, num_blocks=8, block_size=4, prefix_caching=True)
    model.forward(np.array([prompt(6)]), cache)
    shared = cache.tables[0][1]                        # partial last block (tokens 4, 5)
    cache.blocks.share(shared)                         # a second sequence points at it
    copy = cache.copy_on_write(shared)
    assert copy != shared and cache.blocks.ref_count[shared] == 1 and cache.blocks.ref_count[copy] == 1
    for pool in cache.k + cache.v:
        assert np.array_equal(pool[copy], pool[shared])
    cache.blocks.check_invariants()


def test_a_write_into_a_shared_block_copies_it_first(model):
    """Two rows share a partial last block; each one's next token lands in its own copy, logits unchanged."""
    ids = prompt(6, seed=4)
    cache = paged(model, num_blocks=16, block_size=4)
    model.forward(np.array([ids]), cache)
    table = cache.tables[0]
    for b in table:
        cache.blocks.share(b)
    cache.bind([table, list(table)], [6, 6])           # row 1 = a fork of row 0
    out = model.forward(np.array([[20], [21]]), cache)
    assert cache.tables[0][1] != cache.tables[1][1]    # the shared partial block was copied for one of them
    assert cache.tables[0][0] == cache.tables[1][0]    # the full block stays shared
    for row, t in enumerate((20, 21)):
        assert np.abs(out[row] - model.logits(ids + [t])[-1]).max() < TOL
    cache.free()
    assert cache.blocks.num_free == 16
    cache.blocks.check_invariants()


def test_random_operations_never_lose_or_double_count_a_block():
    rng = np.random.default_rng(0)
    bm = BlockManager(12, 2, prefix_caching=True, prefix_cache_blocks=3)
    held: list[int] = []
    for step in range(2000):
        op = rng.integers(4)
        if op == 0 and bm.num_free:
            held.append(bm.allocate())
        elif op == 1 and held:
            bm.release(held.pop(int(rng.integers(len(held)))))
        elif op == 2 and held:
            b = held[int(rng.integers(len(held)))]
            bm.share(b)
            held.append(b)
        elif op == 3 and held:
            bm.register(held[int(rng.integers(len(held)))], None, tuple(rng.integers(0, 5, 2)))
        bm.check_invariants()
        assert bm.num_used == len(set(held))           # referenced blocks counted two ways
        assert sum(bm.ref_count) == len(held)


def test_pool_bytes_formula_matches_the_arrays_the_cache_allocates():
    """`scheduler.pool_bytes` (what the pages check before building a pool) against the nbytes of the real pools."""
    from engine import Model
    from engine.serve.paged_cache import PagedKVCache
    from engine.serve.scheduler import pool_bytes
    from specs.model_config import ModelConfig
    cfg = ModelConfig(name="t", hidden_size=48, num_layers=3, num_heads=6, num_kv_heads=2, head_dim=8,
                      intermediate_size=64, vocab_size=50, max_position_embeddings=64)
    cache = PagedKVCache.for_model(Model.random(cfg, seed=0), num_blocks=7, block_size=5)
    allocated = sum(a.nbytes for a in (*cache.k, *cache.v))
    assert pool_bytes(cfg, 5, 7) == allocated == 7 * cache.bytes_per_block()


def test_the_mirror_reads_exactly_what_a_gather_reads(model, monkeypatch):
    """Rows that continue keep their gathered K/V between passes (the mirror); every read equals a fresh gather of
    the pool, bit for bit in every slot a row holds, through running out of room (MIRROR_ROOM 3: a new gather every
    few tokens), block boundaries, ragged rows, a rebind in another order (a new gather) and rows sharing a table
    (no mirror)."""
    import engine.serve.paged_cache as pc
    monkeypatch.setattr(pc, "MIRROR_ROOM", 3)
    cache = paged(model, num_blocks=64, block_size=4, batch=2)
    a, b = prompt(5, seed=1), prompt(2, seed=2)
    model.forward(np.array([a, b + [0] * 3]), cache, n_valid=np.array([5, 2]))

    def check(rows_mirrored: bool):
        n = int(cache.lengths.max())
        for layer in range(model.config.num_layers):
            k, v = cache.read(layer, n)
            gk, gv = cache._gathered(layer, n)
            assert k.shape == v.shape == gk[:, :, :n].shape
            for row, length in enumerate(cache.lengths):              # slots past a row's length are masked
                assert np.array_equal(k[row, :, :length], gk[row, :, :length])
                assert np.array_equal(v[row, :, :length], gv[row, :, :length])
        assert (cache._mirror is not None) == rows_mirrored

    check(True)
    for i in range(9):                                               # decode both rows, across blocks and room
        model.forward(np.array([[10 + i], [20 + i]]), cache)
        check(True)
    cache.bind(cache.tables[::-1], cache.lengths[::-1])               # another order: gathered afresh
    assert cache._mirror is None
    model.forward(np.array([[7], [8]]), cache)
    check(True)
    shared = cache.tables[0]
    cache.bind([shared, shared], [int(cache.lengths[0])] * 2)        # one request cut into two rows: no mirror
    assert cache._mirror_room(4) is None
    monkeypatch.setattr(pc, "MIRROR_BYTES", 0)                       # over the budget: no mirror either
    cache.bind(cache.tables[:1], cache.lengths[:1])
    assert cache._mirror_room(4) is None


def test_decoding_through_the_mirror_equals_decoding_without_it(model, monkeypatch):
    """The same scheduler run with the mirror and with every read gathered: identical logits, bit for bit."""
    import engine.serve.paged_cache as pc
    from engine import Scheduler
    runs = []
    for budget in (pc.MIRROR_BYTES, 0):
        monkeypatch.setattr(pc, "MIRROR_BYTES", budget)
        s = Scheduler(model, block_size=4, max_batch=3)
        reqs = [s.submit(prompt(3 + 4 * i, seed=i), max_new_tokens=12, stop_at_eos=False, logprobs=2)
                for i in range(3)]
        s.run()
        runs.append([(r.token_ids, r.token_logprobs) for r in reqs])
    assert runs[0] == runs[1]
