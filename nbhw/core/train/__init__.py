"""Training plans: full fine-tuning, LoRA and QLoRA, one device or many, from one real training step on meta."""
