"""An RL ablation outside the trainer (docs/BENCHMARKS.md, "The loss on the high-entropy tokens
only"): with ENT_TOP=0.2 and this directory on PYTHONPATH, every `ragrl rl` the process starts
computes the policy-gradient loss on the 20% highest-entropy response tokens of each micro-batch
only (Wang et al. 2025, "Beyond the 80/20 rule"; entropy under the policy being updated, the
cut per micro-batch rather than per rollout batch). Not a ragrl setting: it measured no gain.

    ENT_TOP=0.2 PYTHONPATH=scripts/entropy_tokens .venv/bin/python scripts/rl_ablation.py \
        --results RUN/results --method search_r1 --name ent20
"""
import os

if os.environ.get("ENT_TOP"):
    share = float(os.environ["ENT_TOP"])
    import torch
    import ragrl.train.rl as rl

    _rlp, _pl, _state = rl.response_logprobs, rl.policy_loss, {}

    def response_logprobs(model, batch, temperature, chunk_tokens, with_entropy, autocast):
        logp, ent = _rlp(model, batch, temperature, chunk_tokens, True, autocast)
        _state["ent"] = ent
        return logp, (ent if with_entropy else None)

    def policy_loss(logp, old, adv, mask, **kw):
        # Every loss must come right after its log-probs: a silent fallback to the full mask would
        # turn the ablation into the default recipe without saying so.
        ent = _state.pop("ent").to(mask.device)
        if ent.shape != mask.shape:
            raise RuntimeError(f"entropy {tuple(ent.shape)} and loss mask {tuple(mask.shape)} differ")
        m = mask.bool()
        if m.any():
            mask = (m & (ent >= torch.quantile(ent[m].float(), 1 - share))).to(mask.dtype)
            _state["kept"] = _state.get("kept", 0) + int(mask.sum())
        return _pl(logp, old, adv, mask, **kw)

    rl.response_logprobs, rl.policy_loss = response_logprobs, policy_loss
    import atexit
    import sys

    atexit.register(lambda: print(f"[entpatch] share {share}, kept tokens {_state.get('kept', 0)}", file=sys.stderr))
