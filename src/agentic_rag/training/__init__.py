"""Training: the GRPO trainer, model loading and the memory estimator (``memory.py``)."""
