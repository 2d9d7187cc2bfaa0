"""What a CPU is, measured (chapter 1): its instruction sets, its clocks, pipes, caches and
bandwidths, the facts the OS gives, and the timing every chapter's measurements share.
"""
