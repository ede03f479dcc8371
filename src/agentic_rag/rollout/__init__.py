"""The rollout engine: a question goes in, the policy reasons, searches, reads and answers, and out comes a
trajectory (token ids, env_mask, logprobs, events) that training, evaluation and the chat service consume."""

from .decoding import DecodeSession, Generation, SamplingParams
from .engine import FINISH_REASONS, AgentRollout, RolloutHooks, RolloutLimits
from .policy import HFPolicy, Policy
from .protocol import Action, ActionKind, Dialect, get_dialect
from .scoring import completion_logprobs
from .trajectory import Segment, Trajectory

__all__ = ["FINISH_REASONS", "Action", "ActionKind", "AgentRollout", "DecodeSession", "Dialect", "Generation",
           "HFPolicy", "Policy", "RolloutHooks", "RolloutLimits", "SamplingParams", "Segment", "Trajectory",
           "completion_logprobs", "get_dialect"]
