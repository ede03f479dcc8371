"""agentic-rag-r1: teach a language model to search while it reasons (GRPO + LoRA/QLoRA + retrieval)."""

__version__ = "0.1.0"
