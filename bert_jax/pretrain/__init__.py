"""Pre-training: the MLM/NSP (SOP) losses and steps, and the run over TFRecord batches."""
