"""Generating (chapter 4 and appendix B): the one C forward and its class, chapter 4's
decoders and int8 weights, and others' GGUF files: read, tokenized, run, exported, written.
"""
