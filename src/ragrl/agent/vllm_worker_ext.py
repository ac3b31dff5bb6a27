"""A vLLM worker extension for the RL trainer's rollout server (ragrl.agent.vllm_sync).

This file runs inside the vLLM server's interpreter, not ragrl's: vllm_sync copies it into the
training's work dir as `ragrl_vllm_worker.py`, puts that directory (and only it) on the server's
PYTHONPATH and names the class with `--worker-extension-cls`; vLLM mixes it into its worker, and
`POST /collective_rpc {"method": "ragrl_reload_weights", ...}` calls it. It imports nothing from
ragrl (the server's environment does not have it).

Why not vLLM's own `reload_weights` alone: its in-place reload (model_loader/reload) re-processes
each layer whose weights the checkpoint holds. A model with tied embeddings (Qwen2.5 up to 3B, the
tiny toy model) has no `lm_head.weight` in its checkpoint: the LM head shares the embedding's
tensor, gets no weights of its own, and is put back as it was ("ParallelLMHead: Failed to load
weights" in the server log). On GPU that is harmless, the shared tensor holds the new values; on
CPU the unquantized LM head computes its logits from a pre-packed copy of the weight made when it
was processed (dispatch_cpu_unquantized_gemm), so the logits kept coming from the old embedding
(vLLM 0.32.0: prompt log-probs up to 1.7 nats off the trainer's after a reload that changed the
embedding, none off when only norms or linear layers changed; tests/backends/test_vllm_rollouts.py, with
this step left out, finds the server 0.2 nats off the trainer after one update). Re-processing every unquantized
embedding-method layer whose weight is shared with another layer repacks it from the new values.
"""

from __future__ import annotations

from typing import Any


class RagrlWeightSync:
    # `self` is vLLM's worker this class is mixed into (reload_weights, get_model, vllm_config).
    def ragrl_reload_weights(self: Any, weights_path: str) -> dict:
        from vllm.config import set_current_vllm_config

        self.reload_weights(weights_path=weights_path)
        model = self.get_model()
        holders: dict[int, list] = {}
        for name, module in model.named_modules():
            weight = module._parameters.get("weight")
            if weight is not None:
                holders.setdefault(id(weight), []).append((name, module))
        redone = []
        with set_current_vllm_config(self.vllm_config):
            for group in holders.values():
                if len(group) < 2:
                    continue
                for name, module in group:
                    method = getattr(module, "quant_method", None)
                    # Only the plain (unquantized) method: re-running a quantized layer's processing
                    # would quantize its already processed weights again.
                    if type(method).__name__ == "UnquantizedEmbeddingMethod":
                        method.process_weights_after_loading(module)
                        redone.append(name)
        return {"weights_path": weights_path, "reprocessed_tied": redone}
