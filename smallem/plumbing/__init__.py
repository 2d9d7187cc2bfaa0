"""The kernels' plumbing: building the C kernels, the compiler, the thread pool, CUDA through
CuPy.
"""
