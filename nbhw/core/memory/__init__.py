"""Memory over time: sources for every usable device and the host, one sampler thread, per-cell attribution."""

from nbhw.core.memory.sampling import *  # noqa: F403
