"""Facts about the demo model the tool side needs without importing the engine (numpy-free)."""

DEMO_VOCAB_SIZE = 2048  # demollm.model.ModelConfig.vocab_size
DEMO_HIDDEN_SIZE = 384  # demollm.model.ModelConfig.hidden_size: > 256, so the block sizes differ
