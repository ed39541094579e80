"""Knowledge distillation for drafters: losses, cached target data, and the training loop."""
