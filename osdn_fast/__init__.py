"""osdn_fast: Triton chunkwise OSDN kernels (forward and backward), the layer and recall training."""
