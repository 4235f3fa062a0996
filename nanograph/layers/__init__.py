"""Model building blocks: norms, rotary embeddings, activations and the attention layer."""
