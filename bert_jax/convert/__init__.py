"""Start points and exports: our workdirs, HuggingFace directories, Google TF checkpoints."""
