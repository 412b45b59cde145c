"""The option solver ("Make it fit"): the best plan by a documented order, and why every option ahead of it lost."""
