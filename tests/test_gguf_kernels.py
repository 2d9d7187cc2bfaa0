"""Others' models in C (kernels_c/forward/blocks.c through smallem.generating.gguf_products, the forward through smallem.generating.forward): each tensor type's row
decoding and product, on every ISA path, against the gguf package's dequantiser and float64;
the activations rounded as llama.cpp rounds them; the C forward against the numpy oracle.

The weights are random bytes in each type's block layout (every bit pattern of the packed
values and scales occurs, -128 in Q8_0 included), with each block's f16 scales set to small
finite values, so no block of any file can hold a pattern these tests did not meet.
"""

import numpy as np
import pytest

import gguf_models
from smallem.generating import gguf_file, gguf_model, gguf_products, quant
from smallem.cpu import isa
from smallem.generating.forward import Forward, Tiled
from smallem.checks import assert_close
from smallem.generating.gguf_file import TYPES, Tensor

# where each block's f16 scales lie (byte offsets), by type
SCALES = {"Q8_0": [0], "Q4_0": [0], "Q5_0": [0], "Q4_K": [0, 2], "Q6_K": [208]}


def assert_product(y, a, w, name):
    """y == a @ w.T within float32's rounding of the partial sums: the kernels (as llama.cpp's)
    convert each lane's exact integer sum to float32 and add lanes of either sign, so the bound
    scales with sum |a_k w_k|, not with |y|; one element off by one step of the weight's or the
    activation's grid is larger than this bound by a factor of about sqrt(K)."""
    ref = a @ w.T
    scale = np.abs(a) @ np.abs(w).T
    k = a.shape[1]
    bound = 4 * 1.2e-7 * np.sqrt(k) * scale + 1e-30
    err = np.abs(y.astype(np.float64) - ref)
    assert y.shape == ref.shape, (name, y.shape, ref.shape)
    assert (err <= bound).all(), (name, int((err > bound).sum()), float((err / bound).max()))


def random_tensor(qtype, N, K, rng) -> Tensor:
    per, nbytes = TYPES[qtype]
    if qtype == "F32":
        raw = rng.normal(0, 1, (N, K)).astype(np.float32)
    elif qtype == "F16":
        raw = rng.normal(0, 1, (N, K)).astype(np.float16)
    elif qtype == "BF16":
        # the file reader gives BF16 as bytes, two a value
        raw = (rng.normal(0, 1, (N, K)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    else:
        blocks = rng.integers(0, 256, (N * K // per, nbytes), dtype=np.uint8)
        for off in SCALES[qtype]:
            d = rng.uniform(0.002, 0.05, len(blocks)).astype(np.float16)
            blocks[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
        raw = blocks.reshape(N, -1)
    return Tensor("w", qtype, (K, N), np.ascontiguousarray(raw))


def _ks(qtype):
    per = TYPES[qtype][0]
    if per == 1:
        return [1, 7, 33, 100]
    return [256, 512, 768] if per == 256 else [32, 64, 96, 288]


@pytest.mark.parametrize("qtype", list(TYPES))
def test_rows_decode_as_the_gguf_package_does(level, qtype, rng):
    """sm_g_row (the embedding lookup) gives the gguf package's reference values, bit for bit."""
    for K in _ks(qtype):
        t = random_tensor(qtype, 5, K, rng)
        want = t.dequantize()
        for i in range(5):
            got = gguf_products.row(t, i)
            assert np.array_equal(got, want[i]), (qtype, K, i, np.abs(got - want[i]).max())


@pytest.mark.parametrize("qtype", list(TYPES))
def test_products_against_float64(level, qtype, rng):
    """Each type's product, one row (decode) and many (a prompt: rows past the block of 4
    weight rows, outputs past the threads' chunks of 16), on one and two threads: the
    rounded activation's values by the dequantised weights, in float64."""
    for K in _ks(qtype):
        for rows, N in ((1, 1), (1, 17), (3, 33), (6, 40)):
            t = random_tensor(qtype, N, K, rng)
            x = rng.normal(0, 1, (rows, K)).astype(np.float32)
            x[0, : min(K, 32)] = 0  # an all-zero block: scale 0
            a = np.stack([gguf_products.quantize(qtype, r)[1] for r in x])
            w = t.dequantize().astype(np.float64)
            for threads in (1, 2):
                y = gguf_products.matmul(t, x, threads=threads)
                assert_product(y, a, w, f"{qtype} {rows}x{K}x{N} threads={threads}")


@pytest.mark.parametrize("qtype", list(TYPES))
def test_activations_round_as_llama_cpp_does(level, qtype, rng):
    """The C rounding of an activation row equals the numpy statement of llama.cpp's
    (gguf_model.round_activation) value for value, zeros, ties and extremes included."""
    K = 512
    x = rng.normal(0, 1, K).astype(np.float32)
    x[:32] = 0
    x[32:64] = np.float32(0.5) * np.arange(32)          # halves: ties for Q8_0's rounding
    x[300] = -40.0                                       # a negative largest value for Q8_K
    got = gguf_products.quantize(qtype, x)[1]
    want = gguf_model.round_activation(qtype, x)
    assert np.array_equal(got, want), (qtype, np.abs(got - want).max())
    if gguf_model.ACTIVATION.get(qtype, "").startswith("Q8"):
        n = 32 if gguf_model.ACTIVATION[qtype] == "Q8_0" else 256
        step = np.abs(x.reshape(-1, n)).max(axis=1) / 127
        # half a step, plus (Q8_0) the f16 rounding of the scale times the largest q
        slack = 0.5 + (127 * 2.0 ** -11 if n == 32 else 0.0)
        assert (np.abs(got - x).reshape(-1, n) <= slack * step[:, None] * 1.001 + 1e-7).all()


PATHS = [("avx2", ""), ("avx2", "avx_vnni"), ("avx512", ""), ("avx512", "avx512_vnni")]


@pytest.mark.parametrize("lvl,without", PATHS, ids=[f"{l}-without-{w or 'nothing'}" for l, w in PATHS])
def test_every_int8_path(lvl, without, monkeypatch, rng):
    """Each level with vpdpbusd (AVX-VNNI on ymm, AVX512-VNNI) and without it (vpmaddubsw),
    for every integer type, against float64: a CPU with VNNI tests both paths."""
    if not isa.supported(lvl):
        pytest.skip(f"this CPU cannot run {lvl}")
    ext = "avx_vnni" if lvl == "avx2" else "avx512_vnni"
    has = ext in isa.cpu_flags()
    if without and not has:
        pytest.skip(f"this CPU has no {ext}: the other parameter runs vpmaddubsw already")
    monkeypatch.setenv("SMALLEM_ISA", lvl)
    monkeypatch.setenv(isa.WITHOUT_ENV, without)
    vnni = has and not without
    want = {("avx2", True): "vpdpbusd (AVX-VNNI)", ("avx2", False): "vpmaddubsw (AVX2)",
            ("avx512", True): "vpdpbusd (AVX512-VNNI)",
            ("avx512", False): "vpmaddubsw (AVX-512)"}[lvl, vnni]
    assert gguf_products.instruction() == want
    for qtype in ("Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q6_K"):
        K = 512
        t = random_tensor(qtype, 19, K, rng)
        x = rng.normal(0, 1, (2, K)).astype(np.float32)
        a = np.stack([gguf_products.quantize(qtype, r)[1] for r in x])
        assert_product(gguf_products.matmul(t, x, threads=2), a, t.dequantize().astype(np.float64),
                       f"{qtype} {lvl} without {without or 'nothing'}")
        if qtype in ("Q8_0", "Q4_0", "Q5_0", "Q4_K"):  # the decode layout in tiles, same path
            # the tiles' rounding: int8 per 32 (Q4_K's tiles: its rows' Q8_K)
            a8 = a if qtype == "Q4_K" else np.stack([gguf_products.quantize("Q8_0", r)[1] for r in x])
            assert_product(gguf_products.matmul(t, x, threads=2, tiles=True), a8,
                           t.dequantize().astype(np.float64), f"tiles {qtype} {lvl}")
        if qtype in gguf_products.INT8_TYPES:  # the prompt's integer GEMM on the same path
            a8 = np.stack([gguf_products.quantize("Q8_0", r)[1] for r in x])
            assert_product(gguf_products.int8_matmul(t, x, threads=2), a8,
                           t.dequantize().astype(np.float64), f"GEMM {qtype} {lvl}")


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q5_0"])
def test_every_block_count_and_prefetch_distance(qtype, level, rng):
    """Block counts that leave every tail of the dots (the eight-block steps of Q8_0, a last
    pair, a last block alone), at every level; and the prefetch changes no bit of a result,
    at any distance, on one thread or two."""
    for K in (32, 64, 96, 256, 288, 320, 352, 896):
        t = random_tensor(qtype, 21, K, rng)
        x = rng.normal(0, 1, (1, K)).astype(np.float32)
        a = np.stack([gguf_products.quantize(qtype, r, level)[1] for r in x])
        y = gguf_products.matmul(t, x, threads=2, level=level)
        assert_product(y, a, t.dequantize().astype(np.float64), f"{qtype} K={K} {level}")
        for ahead, threads in ((0, 1), (64, 2), (4096, 2), (1 << 20, 1)):
            got = gguf_products.matmul(t, x, threads=threads, level=level, ahead=ahead)
            assert np.array_equal(got, y), (qtype, K, ahead, threads)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q5_0", "Q4_K"])
def test_tiles_against_float64(qtype, level, rng):
    """A Q8_0, Q4_0, Q5_0 or Q4_K matrix repacked into chapter 4's tiles (forward.TILE_TYPES) and
    multiplied there: the activations rounded as the tiles round them (int8 per 32; Q4_K's
    as its rows, Q8_K) by the file's values, in float64, at block counts that leave every tail, outputs short of a
    tile, past one and past a thread's run of tiles, one row and several (a prompt's four and
    the rest), one thread and two; an all-zero block of activations (scale 0) included; the
    prefetch distance changes no bit."""
    for K in ((256, 512, 1280) if qtype == "Q4_K" else (32, 64, 96, 288, 896)):
        for rows, N in ((1, 1), (1, 17), (2, 33), (5, 40), (1, 300), (3, 129), (9, 131)):
            t = random_tensor(qtype, N, K, rng)
            x = rng.normal(0, 1, (rows, K)).astype(np.float32)
            x[0, :32] = 0
            a = np.stack([gguf_products.quantize("Q4_K" if qtype == "Q4_K" else "Q8_0", r, level)[1]
                          for r in x])
            w = t.dequantize().astype(np.float64)
            for threads in (1, 2):
                y = gguf_products.matmul(t, x, threads=threads, level=level, tiles=True)
                assert_product(y, a, w, f"{qtype} tiles {rows}x{K}x{N} threads={threads} {level}")
            for ahead in (0, 64, 1 << 20):
                got = gguf_products.matmul(t, x, threads=2, level=level, tiles=True, ahead=ahead)
                assert np.array_equal(got, y), (qtype, K, N, rows, ahead)


def test_only_the_tile_types_have_tiles(rng):
    for qtype in ("Q6_K", "F16", "F32"):
        t = random_tensor(qtype, 4, 256, rng)
        with pytest.raises(ValueError, match="only a Q8_0, Q4_0 or Q5_0"):
            gguf_products.matmul(t, np.zeros((1, 256), np.float32), tiles=True)


def test_a_bad_prefetch_distance_is_one_clear_error(rng):
    t = random_tensor("Q8_0", 4, 64, rng)
    x = np.zeros((1, 64), np.float32)
    with pytest.raises(ValueError, match="ahead"):
        gguf_products.matmul(t, x, ahead=-1)
    with pytest.raises(TypeError, match="ahead"):
        gguf_products.matmul(t, x, ahead=1.5)


def test_the_instruction_is_the_levels(level):
    exts = isa.extensions(level)
    want = {"generic": "plain C",
            "avx2": "vpdpbusd (AVX-VNNI)" if "avx_vnni" in exts else "vpmaddubsw (AVX2)",
            "avx512": ("vpdpbusd (AVX512-VNNI)" if "avx512_vnni" in exts
                       else "vpmaddubsw (AVX-512)")}[level]
    assert gguf_products.instruction(level) == want


def test_bad_products_are_refused(rng):
    t = random_tensor("Q8_0", 4, 64, rng)
    with pytest.raises(ValueError, match="rows of 63"):
        gguf_products.matmul(t, np.zeros((1, 63), np.float32))
    with pytest.raises(ValueError, match="type: expected"):
        gguf_products.quantize("Q2_K", np.zeros(256, np.float32))
    with pytest.raises(ValueError, match="does not fill"):
        gguf_products.quantize("Q4_K", np.zeros(32, np.float32))


# ---------------------------------------------------------------- the forward

def _quantised_copy(src, dst, qtype):
    """The file at ``src`` with every 2-D weight in ``qtype``, by the gguf package's quantiser
    (the appendix's fallback where llama-quantize is not built), norms and biases as they are."""
    from smallem.book.others.files import quantise
    return quantise(src, dst, qtype, None)


# gemma3 with its sliding window short enough for the tests' prompts to cross it: layer 0
# slides (rope base 10^4), layer 1 is global (base 10^6, linear scaling 8, as gemma3:4b's)
WINDOWED = {"gemma3": dict(window=4, swa_pattern=2, base=1e6, rope_base_swa=1e4, rope_linear=8.0)}


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0"])
@pytest.mark.parametrize("arch", list(gguf_file.ARCHS))
def test_the_c_forward_gives_the_oracles_logits(tmp_path, level, arch, qtype):
    """The C forward (a prompt in one call, then tokens one by one) against the float64
    numpy forward that rounds as it does (activations before each product, the f16 cache)."""
    src = gguf_models.write(tmp_path / "m.gguf", arch, None, d=64, hidden=96,
                            head_dim=32 if arch == "qwen3" else None, rope_freqs=arch == "llama",
                            **WINDOWED.get(arch, {}))
    p = src if qtype == "F32" else _quantised_copy(src, tmp_path / f"{qtype}.gguf", qtype)
    mf = gguf_file.open_model(p)
    ref = gguf_model.Reference(mf, np.float64, like_llama=True)
    fw = Forward.from_gguf(mf, threads=2, par_min_bytes=0)
    ids = [1, 5, 9, 200, 3, 7, 100]
    want = ref.forward(ids, all_logits=True)
    got = fw.forward(ids, all_logits=True)
    scale = np.abs(want).max()
    # float32 sums against float64 ones; a rounded value (the query's f16 and the attention's
    # f16 accumulator in every type, the activations' f16 or 8-bit steps in the others) may
    # move by one step where the two land either side of a rounding boundary, and these random
    # models (logits up to about 200) amplify one such step to a few 1e-4 of the scale for
    # f16, 1e-2 to 2e-2 for the 8-bit types; a wrong block, scale or bit moves logits by tens
    # of percent
    tol = {"F32": 1e-3, "F16": 1e-3, "BF16": 1e-3}.get(qtype, 3e-2)
    assert np.abs(got - want).max() <= tol * scale, np.abs(got - want).max() / scale
    for t in (4, 11):
        a, b = fw.forward([t]), ref.forward([t])
        assert np.abs(a - b).max() <= tol * scale
    assert fw.pos == ref.pos == len(ids) + 2


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_attention_sums_in_f16_as_ggml_does(tmp_path, level, arch):
    """The C attention adds the weighted values into an f16 accumulator, key by key, as ggml's
    CPU flash attention does (gguf_model.flash_f16 is the oracle's copy). On F32 weights,
    where nothing else is rounded, the C logits sit an order of magnitude closer (median
    relative difference) to the oracle that sums so than to the one that sums in float: an
    attention summed in f32 would fail the first bound, and the second shows the bound can
    tell the two apart."""
    p = gguf_models.write(tmp_path / "m.gguf", arch, None, d=64, hidden=96,
                          head_dim=32 if arch == "qwen3" else None)
    mf = gguf_file.open_model(p)
    ids = [1, 5, 9, 200, 3, 7, 100, 4, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    got = Forward.from_gguf(mf, threads=2, par_min_bytes=0).forward(ids, all_logits=True)
    f16 = gguf_model.Reference(mf, like_llama=True).forward(ids, all_logits=True)
    f32 = gguf_model.Reference(mf, cache16=True).forward(ids, all_logits=True)
    rel = lambda a, b: float(np.median(np.abs(a - b) / np.abs(b)))  # noqa: E731
    assert rel(got, f16) <= 1e-4
    assert rel(got, f32) >= 2e-4


def test_the_forward_refuses_what_does_not_fit(tmp_path):
    mf = gguf_file.open_model(gguf_models.write(tmp_path / "m.gguf", "llama", None, context=16))
    fw = Forward.from_gguf(mf, threads=1)
    assert fw.context == 16
    with pytest.raises(ValueError, match="ids must lie in"):
        fw.forward([10**6])
    with pytest.raises(ValueError, match="do not fit"):
        fw.forward(list(range(17)))
    with pytest.raises(ValueError, match="context"):
        Forward.from_gguf(mf, context=17)
    fw.forward(list(range(16)))
    with pytest.raises(ValueError, match="do not fit"):
        fw.forward([1])


def test_the_rest_of_a_step_reads_no_weight(tmp_path):
    """The appendix's probe of a step without its products (products=False): every product
    below the GEMM branch writes zeros, so the logits are zeros, the cache still advances;
    the same file's decoder with its products and with any prefetch distance gives the same
    logits, bit for bit."""
    src = gguf_models.write(tmp_path / "m.gguf", "llama", None, d=64, hidden=96)
    mf = gguf_file.open_model(_quantised_copy(src, tmp_path / "q.gguf", "Q8_0"))
    ids = [3, 1, 4, 1, 5]
    rest = Forward.from_gguf(mf, threads=2, par_min_bytes=0, products=False)
    out = rest.forward(ids, all_logits=True, path="c")
    assert rest.pos == len(ids) and not out.any()
    logits = [Forward.from_gguf(mf, threads=2, par_min_bytes=0, ahead=a).forward(ids, path="c")
              for a in (None, 0, 128)]
    assert logits[0].any() and all(np.array_equal(x, logits[0]) for x in logits[1:])
    with pytest.raises(ValueError, match="ahead"):
        Forward.from_gguf(mf, ahead=-4096)


def test_the_parts_of_a_step_are_counted_and_add_up(tmp_path):
    """The probe of a call's parts (Forward.parts_on): on two threads with every product
    teamed (par_min_bytes 0), a token's regions that meet as a team are each layer's four
    product regions (q, k and v together; o; gate and up together; down) and its attention,
    and the head's; each part that runs takes time, their sum stays below the call's wall
    time, and after parts_off nothing more is added. On one thread nothing meets."""
    import time

    from smallem.generating.forward import PARTS

    src = gguf_models.write(tmp_path / "m.gguf", "llama", None, d=64, hidden=96, n_layer=3)
    mf = gguf_file.open_model(_quantised_copy(src, tmp_path / "q.gguf", "Q8_0"))
    fw = Forward.from_gguf(mf, threads=2, par_min_bytes=0)
    fw.forward([3, 1, 4])
    sums = fw.parts_on()
    t0 = time.perf_counter()
    for t in (1, 5, 9, 2):
        fw.forward([t])
    wall = time.perf_counter() - t0
    fw.parts_off()
    got = dict(zip(PARTS, sums.copy()))
    assert got["teamed"] == 4 * (5 * 3 + 1)
    for p in ("norm", "round", "products", "positions", "attend", "activation", "embed"):
        assert got[p] > 0, p
    assert sum(v for k, v in got.items() if k != "teamed") < wall
    fw.forward([7])
    assert np.array_equal(sums, [got[p] for p in PARTS])
    one = Forward.from_gguf(mf, threads=1)
    sums = one.parts_on()
    one.forward([3, 1])
    assert sums[PARTS.index("teamed")] == 0 and sums[PARTS.index("products")] > 0


def _q4_0_tiles(blocks: np.ndarray, N: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """A Q4_0 matrix's tiles as sm_g_tile_q4_0 lays them out, in numpy: tiles of 16 rows in
    groups of 8; in a group, block b's 4-byte group g of every tile's 16 rows is one line per
    tile, the group's tiles side by side; the f16 scales as Q8_0's."""
    nb, tiles = K // 32, -(-N // 16)
    qs = np.zeros((tiles * 16, nb, 16), np.uint8)
    d = np.zeros((tiles * 16, nb), np.uint16)
    qs[:N] = blocks[:, :, 2:]
    d[:N] = blocks[:, :, :2].copy().view(np.uint16)[..., 0]
    q, s = [], []
    for first in range(0, tiles, 8):
        ng = min(8, tiles - first)
        grp = qs[16 * first:16 * (first + ng)].reshape(ng, 16, nb, 4, 4)  # tile, row, b, g, byte
        q.append(grp.transpose(2, 3, 0, 1, 4).reshape(-1))               # b, g, tile, row, byte
        s.append(d[16 * first:16 * (first + ng)].reshape(ng, 16, nb).transpose(2, 0, 1).reshape(-1))
    return np.concatenate(q), np.concatenate(s)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q5_0"])
def test_a_file_decodes_through_its_tiles(qtype, tmp_path, level):
    """Forward repacks each Q8_0, Q4_0 or Q5_0 matrix (not the embedding) into tiles once a
    Spec and decodes through them: the tiles hold the file's integers (Q4_0's nibbles as they
    are; Q5_0's layout is checked by the products against float64) and scales, and the logits of a prompt and of the steps after it equal those of the same
    decoder on the file's rows up to the order of float32 sums (the integers and their
    scales are the same)."""
    src = gguf_models.write(tmp_path / "m.gguf", "llama", None, d=64, hidden=96)
    mf = gguf_file.open_model(_quantised_copy(src, tmp_path / "q.gguf", qtype))
    tiles = Forward.from_gguf(mf, threads=2, par_min_bytes=0)
    rows = Forward.from_gguf(mf, threads=2, par_min_bytes=0, repack=False)
    kept = [w for w in tiles._keep if isinstance(w, Tiled)]
    assert kept and not any(isinstance(w, Tiled) for w in rows._keep)
    assert all(w.blocks.t.name != "token_embd.weight" for w in kept)
    assert any(w.blocks.t.type == qtype for w in kept)
    for w in kept:  # the layout the packer writes, from the file's blocks
        if w.blocks.t.type == "Q8_0":
            blocks = w.blocks.data.reshape(w.N, -1, 34)
            q = blocks[:, :, 2:].copy().view(np.int8).reshape(w.N, w.K).T
            d = blocks[:, :, :2].copy().view(np.float16)[..., 0].T
            wq, ws = quant.pack_q8(q, d)
            assert np.array_equal(w.q.view(np.int8), wq) and np.array_equal(w.s, ws), w.blocks.t.name
        elif w.blocks.t.type == "Q4_0":
            wq, ws = _q4_0_tiles(w.blocks.data.reshape(w.N, -1, 18), w.N, w.K)
            assert np.array_equal(w.q, wq) and np.array_equal(w.s, ws), w.blocks.t.name
    ids = [3, 1, 4, 1, 5, 9, 2]
    for a, b in ((tiles.forward(ids, all_logits=True, path="c"),
                  rows.forward(ids, all_logits=True, path="c")),
                 (tiles.forward([6]), rows.forward([6]))):
        assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max()


@pytest.mark.parametrize("dtype", ["f32", "bf16", "int8"])
@pytest.mark.parametrize("arch", list(gguf_file.ARCHS))
def test_the_prompt_through_the_gemm_continues_as_the_c_path(tmp_path, level, arch, dtype):
    """A prompt through chapter 2's GEMM (float32 or bf16 inputs, the weights dequantised a
    panel at a time) or through the integer GEMM (int8: the C path's own Q8_0 rounding) gives the float64 logits up to its inputs' rounding and the C path's up
    to the C path's activation rounding, and leaves the same cache: the decode steps after it
    agree with those after the C path."""
    src = gguf_models.write(tmp_path / "m.gguf", arch, None, d=64, hidden=96,
                            head_dim=32 if arch == "qwen3" else None, rope_freqs=arch == "llama",
                            **WINDOWED.get(arch, {}))
    mf = gguf_file.open_model(_quantised_copy(src, tmp_path / "q.gguf", "Q8_0"))
    ids = list(range(3, 40))
    c = Forward.from_gguf(mf, threads=2, par_min_bytes=0)
    g = Forward.from_gguf(mf, threads=2, par_min_bytes=0, prompt_dtype=dtype)
    ref = gguf_model.Reference(mf, np.float64, cache16=True)  # what the GEMM computes
    a, b = c.forward(ids, all_logits=True, path="c"), g.forward(ids, all_logits=True, path="gemm")
    want = ref.forward(ids, all_logits=True)
    scale = np.abs(want).max()
    # f32 against float64 with the f16 cache; bf16 inputs: 8-bit mantissas, as coarse as the
    # C path's 8-bit activations
    # bf16 inputs: 8-bit mantissas; with the blocked attention (f32 sums, not ggml's f16)
    assert np.abs(b - want).max() <= (2e-3 if dtype == "f32" else 4e-2) * scale
    assert g.prompt_dtype == dtype
    assert np.abs(a - b).max() <= 4e-2 * scale           # the C path's 8-bit activations, f16 sums
    assert c.pos == g.pos == len(ids)
    for t in (5, 6, 7):
        x, y = c.forward([t]), g.forward([t])
        assert np.abs(x - y).max() <= 3e-2 * scale
    more = list(range(50, 60))   # a prompt that continues the cache, through the GEMM too
    x, y = c.forward(more, all_logits=True, path="c"), g.forward(more, all_logits=True, path="gemm")
    assert np.abs(x - y).max() <= 3e-2 * scale
    with pytest.raises(ValueError, match="path"):
        c.forward([1], path="blas")
    with pytest.raises(ValueError, match="prompt_dtype"):
        Forward.from_gguf(mf, prompt_dtype="f16")


def test_every_type_is_supported_and_rounds_its_activation_as_llama_does(level):
    """The C side multiplies every type the reader accepts and none other, and pairs each with
    the activation type ggml's vec_dot_type names (on AVX-512, Q4_0 and Q5_0 take the
    paired Q8_0 layout, which holds the same Q8_0 values, and Q8_0 does too where the level
    has VNNI)."""
    from smallem.plumbing import build
    ffi, lib = build.load("forward", level)
    for name in TYPES:
        assert lib.sm_g_supported(gguf_products.type_id(name)) == 1, name
    for name in ("Q2_K", "Q3_K", "IQ4_NL"):
        assert lib.sm_g_supported(gguf_products.type_id(name)) == 0, name
    pairs = {"F32": "F32", "F16": "F16", "BF16": "BF16", "Q4_K": "Q8_K", "Q6_K": "Q8_K"}
    for w, a in pairs.items():
        assert lib.sm_g_act_type(gguf_products.type_id(w)) == gguf_products.type_id(a), w
    paired_q8 = level == "avx512" and "VNNI" in gguf_products.instruction(level)
    assert lib.sm_g_act_type(gguf_products.type_id("Q8_0")) == (
        1000 if paired_q8 else gguf_products.type_id("Q8_0"))
    for w in ("Q4_0", "Q5_0"):
        got = lib.sm_g_act_type(gguf_products.type_id(w))
        assert got == (1000 if level == "avx512" else gguf_products.type_id("Q8_0")), w


# ---------------------------------------------------------------- the prompt's integer GEMM
@pytest.mark.parametrize("qtype", gguf_products.INT8_TYPES)
def test_int8_gemm_against_float64(level, qtype, rng):
    """kernels_c/forward/qgemm.c on this level: the rows rounded to Q8_0 blocks as llama.cpp
    rounds them, then every block's integer sum exact and scaled, on awkward shapes: one row,
    rows past and short of the micro-tile, columns short of a 32-column group and one past it,
    K of one block (one super-block for Q4_K and Q6_K) and of more than one pass over the panel
    (16 blocks), on 1 and 2 threads. Where the level has AMX tiles (the emulator's too), the
    tiles' path as well, with rows past and short of its 32-row step."""
    shapes = [(1, 1, 32, 1), (5, 33, 64, 2), (7, 31, 544, 1), (13, 70, 96, 2), (64, 96, 1056, 2),
              (45, 40, 96, 2)]
    if qtype.endswith("_K"):  # whole super-blocks of 256
        shapes = [(1, 1, 256, 1), (5, 33, 512, 2), (7, 31, 768, 1), (13, 70, 256, 2),
                  (64, 96, 1280, 2), (45, 40, 256, 2)]
    paths = [False, True] if gguf_products.int8_amx(level) else [False]
    if level == "avx512" and "amx_int8" in isa.extensions(level):
        assert paths == [False, True], "this CPU has AMX_INT8 but the integer GEMM has no tiles"
    for rows, N, K, threads in shapes:
        t = random_tensor(qtype, N, K, rng)
        x = rng.normal(0, 1, (rows, K)).astype(np.float32)
        x[0, :32] = 0.0  # a block of zeros: its scale 0
        a = np.stack([gguf_products.quantize("Q8_0", r)[1] for r in x])
        for amx in paths:
            y = gguf_products.int8_matmul(t, x, threads=threads, level=level, amx=amx)
            assert_product(y, a, t.dequantize().astype(np.float64),
                           f"{qtype} {level} {rows}x{N}x{K} amx={amx}")
    if not paths[-1]:
        with pytest.raises(RuntimeError, match="no tiles"):
            gguf_products.int8_matmul(t, x, level=level, amx=True)


@pytest.mark.parametrize("qtype", gguf_products.INT8_TYPES)
def test_int8_gemm_tiles_through_the_emulator_where_avx512_has_no_amx(qtype, rng, amx_emulated):
    """The tiles' path of the integer GEMM on a CPU with AVX-512 but no AMX_INT8 (a Zen 4 or
    5), which the level fixture runs natively and so never on tiles: built through SIMDe with
    emulate.h's tiles, against float64 on awkward shapes (rows past and short of the 32-row
    step and of a 16-row quarter, columns short of a 16-column quarter, one block and many),
    and against the vector kernel's own bits where that kernel makes one pass over the blocks
    (16 or fewer): both then sum the blocks in the same order."""
    assert gguf_products.int8_amx("avx512")
    k1 = 256 if qtype.endswith("_K") else 32
    for rows, N, K, threads in [(1, 1, k1, 1), (17, 33, 2 * k1, 2), (45, 40, 3 * k1, 2),
                                (64, 96, 16 * k1 if k1 == 32 else 2 * k1, 1), (33, 15, k1, 2)]:
        t = random_tensor(qtype, N, K, rng)
        x = rng.normal(0, 1, (rows, K)).astype(np.float32)
        x[-1, :32] = 0.0  # a block of zeros: its scale 0
        a = np.stack([gguf_products.quantize("Q8_0", r)[1] for r in x])
        y = gguf_products.int8_matmul(t, x, threads=threads, level="avx512", amx=True)
        assert_product(y, a, t.dequantize().astype(np.float64), f"{qtype} tiles {rows}x{N}x{K}")
        v = gguf_products.int8_matmul(t, x, threads=threads, level="avx512", amx=False)
        assert K // 32 > 16 or np.array_equal(y, v), (qtype, rows, N, K, float(np.abs(y - v).max()))


def test_int8_gemm_instruction_and_refusals(level, rng):
    exts = isa.extensions(level)
    want = {"generic": "plain C",
            "avx2": "vpdpbusd (AVX-VNNI)" if "avx_vnni" in exts else "vpmaddubsw (AVX2)",
            "avx512": ("vpdpbusd (AVX512-VNNI)" if "avx512_vnni" in exts
                       else "vpdpbusd (AVX-VNNI)" if "avx_vnni" in exts
                       else "vpmaddubsw (AVX2)")}[level]
    assert gguf_products.int8_instruction() == want
    with pytest.raises(ValueError, match="takes Q8_0"):
        gguf_products.int8_matmul(random_tensor("F16", 2, 256, rng), np.zeros((1, 256), np.float32))
    with pytest.raises(ValueError, match="expected"):
        gguf_products.int8_matmul(random_tensor("Q8_0", 2, 64, rng), np.zeros((1, 63), np.float32))


def test_the_prompt_path_is_one_choice_whatever_level_is_named():
    """The prompt's two rates are timed once on a machine and kept: a call that names the
    level and one that leaves it to the CPU read the same rates, so they make the same
    choice (two timings in one process once disagreed, and the page with them)."""
    from smallem.cpu import isa
    from smallem.generating import forward

    assert forward.prompt_rates() == forward.prompt_rates(isa.selected())
    assert forward.default_prompt_dtype() == forward.default_prompt_dtype(isa.selected())
