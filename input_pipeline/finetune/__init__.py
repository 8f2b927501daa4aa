"""Fine-tuning data: readers for GLUE, MR, SQuAD, SWAG and CoNLL files, and their features."""
