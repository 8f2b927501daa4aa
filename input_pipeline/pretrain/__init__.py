"""Pre-training records: corpus -> sentence pairs and masking -> TFRecord shards -> batches."""
