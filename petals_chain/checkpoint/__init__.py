"""Real checkpoints: their sizes in the memory model (s_m, s_c, cache slots) and the GGUF-to-HF conversion."""
