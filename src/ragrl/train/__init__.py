"""Training. RL: a compact critic-free policy-gradient core (GRPO / PPO-clip) on accelerate;
why our own loop rather than TRL's GRPOTrainer is explained in ragrl.train.rl.
"""

__all__ = ["RLConfig", "Sample", "train_rl"]


def __getattr__(name: str):
    # Lazy: importing a sibling (e.g. ragrl.train.sft) should not pull in the RL trainer.
    if name in __all__:
        from ragrl.train import rl

        return getattr(rl, name)
    raise AttributeError(f"module 'ragrl.train' has no attribute {name!r}")
