"""What pre-training and fine-tuning share: setup, train state, the loop, checkpoints, the
optimizer, sharding rules, metrics output, progress and run control. Knows no objective: the
loss and the data come from the caller."""
