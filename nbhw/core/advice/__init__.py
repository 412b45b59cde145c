"""Advice for one model on one device: attention implementations, Hub kernels, dtype."""
