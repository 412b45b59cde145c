"""What the installed transformers and accelerate say: meta builds, model configs, kernel tables, their source."""
