"""The matrix product (chapter 2): the GEMM and its ladder of rungs, f32 and bf16.
"""
