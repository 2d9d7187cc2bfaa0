"""Numbers quoted from the reference series, never measured here.

They are shown beside our measurements, always labelled with their machine and
cited (see bibliography.md, ``#smallem-fr``). A ``None`` means the reference did
not publish that figure.
"""

from smallem.training.model import CONFIGS

MACHINE = "Ryzen 7 7700 (8 Zen 4 cores) vs RTX 3090"
CPU = "Ryzen 7 7700, 8 Zen 4 cores"   # the reference's two machines, as its tables name them
GPU = "RTX 3090"
CORES = 8                          # the reference's CPU cores: per-core figures divide by this
CITE = "[Smallem : le processeur](bibliography.md#smallem-fr)"

CH1_F32_PEAK_GOPS = 1314          # measured f32 peak, 8 cores
CH2_GEMM_1024_NAIVE_GOPS = 0.65   # naive 1024^3 product
CH2_GEMM_1024_FINAL_GOPS = 1071   # final rung, 8 threads
CH3_XL_STEP_BEFORE_TOKS = 5       # GPT-2-style "xl" training step, tokens/s
CH3_XL_STEP_AFTER_TOKS = 3813
# The reference's own table gives that step's efficiency ("rendement", 46 %) without saying
# how it counts FLOPs; this book counts them its own way (chapter 3: 6N + 12 L T d per token,
# the PaLM paper's count) and divides by the reference's own f32 peak: the one figure both
# chapter 3 and the home page show.
CH3_XL_MFU_CPU = (CH3_XL_STEP_AFTER_TOKS * CONFIGS["xl"].flops_per_token()
                  / (CH1_F32_PEAK_GOPS * 1e9))
CH3_XL_MFU_GPU = 0.14             # the reference's own figure for its GPU (no peak published)
CH3_MODERN_BEFORE_TOKS = 3006     # modern bf16 step with Muon
CH3_MODERN_AFTER_TOKS = 3897
CH4_GEN_BEFORE_TOKS = 16          # one-sequence generation, tokens/s
CH4_GEN_AFTER_TOKS = 2619
CH4_GEN_GPU_TOKS = 989
