"""Every Python name of a C id agrees with the compiled forward.

The C side's ids (a matrix's kind, the norm, the MLP, the RoPE, the cache, ggml's type numbers)
are the enums of ``kernels_c/forward.h``, which cffi reads as it builds the library; the
types each product takes and their blocks are functions of the library. Python keeps names for
them (``smallem.generating.forward``, ``gguf_file.TYPES``), and these tests fail where any of
them disagrees with the library built here, or with the gguf package's own table of ggml's
types.
"""

import subprocess

import gguf
import pytest

from smallem.cpu import isa
from smallem.generating import decode, forward, gguf_file, gguf_products
from smallem.plumbing import build, toolchain


@pytest.fixture
def lib(level):
    """The forward built at each ISA level (each is its own compiled library)."""
    return build.load("forward", level)[1]


@pytest.mark.parametrize("names, prefix", [
    (("f32", "int8", "blocks"), "KIND"),
    (forward.NORMS, "NORM"),
    (forward.MLPS, "MLP"),
    (tuple("none" if r is None else r for r in forward.ROPES), "ROPE"),
    (forward.CACHES, "CACHE"),
])
def test_each_python_choice_is_the_libraries_number(lib, names, prefix):
    """The Spec's choices are packed as their place in these tuples: each place is the enum."""
    for i, name in enumerate(names):
        assert getattr(lib, f"{prefix}_{name.upper()}") == i, (prefix, name)
    assert forward.KIND_BLOCKS == lib.KIND_BLOCKS


def test_ggml_type_numbers_are_the_libraries_and_the_formats(lib):
    for name, number in forward.GGML_IDS.items():
        assert getattr(lib, f"T_{name}") == number, name
        assert int(gguf.GGMLQuantizationType[name]) == number, name
    assert forward.Q8_0_ID == lib.T_Q8_0 and decode.Q8_0_ID == lib.T_Q8_0


def test_the_types_each_product_takes_are_the_libraries(lib):
    """The reader's types are the ones the block products take, with the library's block
    geometry (and ggml's); the integer GEMM's types are the ones Python sends it."""
    every = range(64)
    assert {t for t in every if lib.sm_g_supported(t)} == {
        forward.GGML_IDS[n] for n in gguf_file.TYPES}
    for name, (weights, nbytes) in gguf_file.TYPES.items():
        t = forward.GGML_IDS[name]
        assert (lib.sm_g_block_weights(t), lib.sm_g_block_bytes(t)) == (weights, nbytes), name
        assert tuple(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]) == (weights, nbytes)
    assert {t for t in every if lib.sm_q_supported(t)} == set(forward.INT8_TYPE_IDS)
    assert gguf_products.INT8_TYPES == forward.INT8_TYPES
    assert all(gguf_products.type_id(n) == forward.GGML_IDS[n] for n in forward.INT8_TYPES)


def test_one_table_names_every_tensor_once_and_its_parts_are_the_c_layers_fields():
    """gguf_file's table is the one home of the tensor names: each of our names and each of
    the file's names appears once, and every part a forward reads is a field of the C
    forward's sm_layer (or, at the top, of sm_model), which the Spec fills by that name."""
    rows = gguf_file.TOP + gguf_file.LAYER
    ours = [p.ours for p in rows]
    files = [p.gguf for p in rows]
    assert len(set(ours)) == len(ours) and len(set(files)) == len(files)
    ffi, _ = build.load("forward")
    fields = {name for name, _ in ffi.typeof("sm_layer").fields}
    read = {p.ours for p in gguf_file.LAYER if p.ne is not None}
    assert read <= fields, read - fields
    top = {p.ours for p in gguf_file.TOP if p.ne is not None}
    assert top <= {name for name, _ in ffi.typeof("sm_model").fields}
    # a fused architecture's parts are matrices of the table, and their whole is a row too
    for whole, parts in gguf_file.FUSED:
        assert whole in ours and set(parts) <= read
    # every name a file of each architecture must hold comes from the table
    for arch in gguf_file.ARCHS.values():
        h = gguf_file.Hyper(arch, d=8, n_layer=2, n_head=2, n_kv_head=1, head_dim=4, v_dim=4,
                            hidden=16, vocab=300, context=8, eps=1e-6, rope_base=1e4,
                            rope_dim=4, tied=False)
        for key in gguf_file.expected_shapes(h):
            assert key in files or key.split(".", 2)[2] in files, (arch.name, key)


@pytest.mark.parametrize("level", isa.LEVELS)
@pytest.mark.parametrize("part", sorted(p.name for p in (build.KERNELS_DIR / "forward").glob("*.c")))
def test_each_file_of_the_forward_compiles_alone(level, part):
    """forward.c includes kernels_c/forward/*.c into one unit, and each of them includes what
    it uses (forward/internal.h, the file it builds on), so each also compiles alone: at
    every ISA level with every extension the level can have (a syntax check: no CPU needed)."""
    cc = toolchain.compiler()
    flags = isa.compile_flags(level, isa.OPTIONAL.get(level, ())) + build.openmp_flags(cc)[0]
    r = subprocess.run([cc, "-fsyntax-only", "-std=gnu11", "-Wall", "-Wno-unused-function",
                        *flags, str(build.KERNELS_DIR / "forward" / part)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr[-2000:]


def test_every_metadata_key_is_spelled_once_and_every_switch_is_a_c_field():
    """gguf_file.KEYS is the one spelling of each GGUF metadata key (the reader and the writer
    read it; no other module of the library types one), and every switch Hyper.switches
    hands the C forward is a field of sm_model (packed by name)."""
    from pathlib import Path

    root = Path(gguf_file.__file__).resolve().parents[1]
    for name, (suffix, _, _) in gguf_file.KEYS.items():
        where = [str(p.relative_to(root)) for p in sorted(root.rglob("*.py"))
                 if f'"{suffix}"' in p.read_text() or f"'{suffix}'" in p.read_text()]
        assert where == ["generating/gguf_file.py"], (suffix, where)
    ffi, _ = build.load("forward")
    fields = {f for f, _ in ffi.typeof("sm_model").fields}
    for arch in gguf_file.ARCHS.values():
        h = gguf_file.Hyper(arch, 64, 1, 2, 2, 32, 32, 128, 256, 16, 1e-6, 1e4, 32, True)
        assert set(h.switches()) <= fields, set(h.switches()) - fields
