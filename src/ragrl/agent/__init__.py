"""The agent side of R1-style RAG: the tag protocol, search environments, generation backends and
the batched multi-turn rollout engine.

`protocol` is pure (strings in, strings out); `environments` talks to a retriever;
`generation` talks to a model or a server; `rollout` ties them together.

Names are loaded lazily so that `ragrl.agent.protocol` (used by the reward functions) does not
pull in torch and transformers.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Action": "protocol",
    "ActionSpec": "protocol",
    "parse_action": "protocol",
    "MultiQuerySearchEnvironment": "environments",
    "RetrievalResultError": "environments",
    "Retriever": "environments",
    "SearchEnvironment": "environments",
    "ClosedBookEnvironment": "environments",
    "GenerationBackendError": "generation",
    "Generator": "generation",
    "HFGenerator": "generation",
    "OpenAICompletionsGenerator": "generation",
    "RolloutConfig": "rollout",
    "RolloutEngine": "rollout",
    "Trajectory": "rollout",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"ragrl.agent.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'ragrl.agent' has no attribute '{name}'")
