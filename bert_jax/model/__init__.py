"""The Flax encoder, its task heads and their FLOP counts: no training code."""
