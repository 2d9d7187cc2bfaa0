"""Training (chapter 3): the model and its layers, the kernels' Python side, the trainer,
the data, checkpoints, the MPI step (appendix A) and the PyTorch twin the tests compare with.
"""
