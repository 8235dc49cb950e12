"""Fine-tuning: what `[finetune]` trains, adds and skips (`llmpar.spec.finetune`)."""
