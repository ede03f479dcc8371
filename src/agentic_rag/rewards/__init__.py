"""Rewards: answer accuracy (shared with evaluation), format well-formedness, retrieval quality (RAGAS), the
LLM judge, and R1-Searcher's curriculum. They see text, answers and trajectory events only."""
