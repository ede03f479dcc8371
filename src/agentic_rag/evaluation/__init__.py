"""Evaluation: the rollout engine over a benchmark with any policy (a local model + adapter, or an
OpenAI-compatible endpoint), scored with the project's one scorer (:mod:`agentic_rag.rewards.accuracy`),
resumable, with a side-by-side report of runs. See :mod:`.runner` for the output files."""
