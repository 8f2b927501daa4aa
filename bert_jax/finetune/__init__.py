"""Fine-tuning: tasks, their losses and metrics, SQuAD answer decoding, and the run over seeds
and epochs (`python -m bert_jax.finetune`)."""
