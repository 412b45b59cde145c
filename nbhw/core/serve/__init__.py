"""Serving with transformers' continuous batching: the paged cache it will allocate, and how many requests fit."""
