"""Supervised fine-tuning on pre-tokenized trajectories with TRL's `SFTTrainer` (trl 1.16).

Input: the parquet of `ragrl.train.sft_data` (`input_ids`, `assistant_masks`). TRL 1.16 treats a
dataset with an `input_ids` column as pre-tokenized and, when it has no `labels` column, builds
labels from `assistant_masks` (always applied: label = token id where the mask is 1, else -100)
and from `completion_mask` (only with `completion_only_loss=True`), then drops the mask columns.
So the loss is on generated tokens only (observations and prompt are context, never targets)
with the defaults `assistant_only_loss=False` (that flag means "render a conversational dataset
with the chat template's generation markers", and TRL rejects it for non-conversational data) and
`completion_only_loss=False` (nothing here is a prompt/completion pair). `max_length=None`, since
TRL's default (1024) would silently truncate multi-turn trajectories; `packing=False`, so a
sequence is never split (`padding_free` joins a batch's sequences into one row, each whole).

Output (`out_dir`, written atomically): the full model (safetensors) and tokenizer, or with LoRA
the adapter (`adapter_config.json`, `adapter_model.safetensors`) and tokenizer, plus
`sft_log.jsonl` (TRL's log records). Nothing pickled: the trainer's `save_model` would also write
`training_args.bin` (a pickle), so the model is saved with `save_pretrained` instead.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import torch

from ragrl.errors import InputError
from ragrl.hostinfo import read_record, segment, training_record, write_record
from ragrl.io import atomic_dir
from ragrl.settings import DEFAULT_LORA_TARGETS, FUSED_LM_HEAD_MIN_VOCAB, SFTArgs  # noqa: F401  (re-exported)
from ragrl.train import packed_attention

DATA_COLUMNS = ("input_ids", "assistant_masks")



def load_sft_dataset(path: str | Path):
    """The parquet as an in-memory `datasets.Dataset` of just the columns the trainer uses."""
    import datasets

    table = pq.read_table(path, columns=list(DATA_COLUMNS))
    if table.num_rows == 0:
        raise InputError(f"{path}: no SFT examples")
    return datasets.Dataset(table)


def lora_config(args: SFTArgs):
    from peft import LoraConfig

    return LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                      target_modules=list(args.lora_target_modules), bias="none", task_type="CAUSAL_LM")


def sft_config(args: SFTArgs, output_dir: str | Path):
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(output_dir),
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        lr_scheduler_type=args.lr_scheduler,
        max_grad_norm=args.max_grad_norm,
        seed=args.seed,
        data_seed=args.seed,
        train_sampling_strategy="group_by_length" if args.group_by_length else "random",
        bf16=_bf16(args.bf16),
        # transformers 5 name; it overrides TRL's `gradient_checkpointing=True` default (a deprecated alias).
        activation_checkpointing=args.gradient_checkpointing,
        # The mask columns carry the loss mask; see the module docstring.
        assistant_only_loss=False,
        completion_only_loss=False,
        max_length=args.max_length,
        packing=False,
        padding_free=args.padding_free,
        logging_steps=args.log_every,
        logging_first_step=True,
        # A log file is not a terminal: tqdm's carriage returns would pile up into one huge line.
        disable_tqdm=not sys.stderr.isatty(),
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
        model_init_kwargs=_model_init_kwargs(args),
    )


def _model_init_kwargs(args: SFTArgs) -> dict:
    # Trained weights in float32 whatever `bf16` says: bf16 is the trainer's autocast, as in the RL
    # trainer (docs/RL.md, "fp32 masters, bf16 compute"). Loaded in bf16, AdamW updated bf16 weights
    # in place, and an update below half a bf16 ulp rounds away: at a paper's lr (1e-5, RAG-R1's
    # full-weight cold start) most weights never change.
    # With LoRA the base is frozen and PEFT keeps the adapters in float32: the base stays bf16.
    kwargs = {"dtype": "bfloat16" if args.lora and _bf16(args.bf16) else "float32"}
    if args.padding_free:
        # transformers' default, SDPA, would attend over the whole joined row under a block mask
        # (TRL asks for no implementation); this attends within each sequence, as the varlen
        # kernels of flash-attention do (ragrl.train.packed_attention).
        kwargs["attn_implementation"] = packed_attention.register()
    return kwargs


def uses_fused_lm_head(args: SFTArgs, vocab_size: int) -> bool:
    return args.fused_lm_head if args.fused_lm_head is not None else vocab_size >= FUSED_LM_HEAD_MIN_VOCAB


def full_logits_loss(logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None):
    """(loss, log-probabilities at the labelled positions, their labels) of next-token prediction
    from full logits.

    The same loss as TRL's fused LM head: the sum of -log p over the positions whose next-token
    label is not -100, divided by `num_items_in_batch` (the trainer's count across gradient
    accumulation) or by the number of such positions."""
    mask = labels[:, 1:] != -100
    target = labels[:, 1:][mask]
    logp = torch.log_softmax(logits[:, :-1][mask].float(), dim=-1)
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    denominator = target.numel() if num_items_in_batch is None else num_items_in_batch
    return nll.sum() / torch.as_tensor(denominator, device=nll.device).clamp(min=1), logp, target


def right_padded(mask: torch.Tensor | None) -> bool:
    """Whether every row of an attention mask is ones then zeros (padding only at the end)."""
    return mask is not None and mask.dim() == 2 and bool((mask[:, 1:] <= mask[:, :-1]).all())


def _full_logits_trainer_class():
    from trl import SFTTrainer

    class FullLogitsSFTTrainer(SFTTrainer):
        """SFTTrainer whose loss reads the model's plain logits (see SFTArgs.fused_lm_head); it logs
        the same metrics (entropy, mean_token_accuracy, num_tokens) as TRL's own compute_loss."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            mode = "train" if self.model.training else "eval"
            model_inputs = {k: v for k, v in inputs.items() if k != "labels"}
            # A packed row keeps the mask packed_attention.packed_row_mask gave it (or its lack).
            if "cu_seq_lens_q" not in model_inputs and right_padded(model_inputs.get("attention_mask")):
                # Causal attention alone gives every real token the same context (its padding
                # comes after it), and lets SDPA skip the masked half instead of reading a mask.
                del model_inputs["attention_mask"]
            outputs = model(**model_inputs, use_cache=False)
            loss, logp, target = full_logits_loss(outputs.logits, inputs["labels"], num_items_in_batch)
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * self.accelerator.num_processes  # as Trainer: DDP averages the gradients
            with torch.no_grad():
                logp = logp.detach()
                gather = self.accelerator.gather_for_metrics
                n = gather(torch.tensor(target.numel(), device=target.device)).sum()
                entropy = gather(-(logp.exp() * logp).sum()).sum()
                correct = gather((logp.argmax(-1) == target).sum()).sum()
                self._metrics[mode]["entropy"].append((entropy / n).item() if n > 0 else 0.0)
                self._metrics[mode]["mean_token_accuracy"].append((correct / n).item() if n > 0 else 0.0)
                if mode == "train":  # a packed row has no padding, and no mask where it needs the block mask
                    mask = inputs.get("attention_mask")
                    tokens = mask.sum() if mask is not None else torch.tensor(inputs["input_ids"].numel())
                    self._total_train_tokens += gather(tokens).sum().item()
                self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
            return (loss, outputs) if return_outputs else loss

    return FullLogitsSFTTrainer


def build_trainer(model_dir: str | Path, data_parquet: str | Path, output_dir: str | Path, args: SFTArgs):
    """An `SFTTrainer` ready to `train()`; its prepared dataset and collator can be inspected first."""
    import transformers
    from trl import SFTTrainer

    _quiet_progress_bars()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    config = sft_config(args, output_dir)
    vocab = transformers.AutoConfig.from_pretrained(model_dir).get_text_config().vocab_size
    trainer_class = SFTTrainer if uses_fused_lm_head(args, vocab) else _full_logits_trainer_class()
    trainer = trainer_class(
        model=str(model_dir),
        args=config,
        train_dataset=load_sft_dataset(data_parquet),
        processing_class=tokenizer,
        peft_config=lora_config(args) if args.lora else None,
    )
    if args.padding_free:
        trainer.data_collator = with_packed_mask(trainer.data_collator, trainer.model.config)
    _install_log_lines(trainer)
    return trainer


def with_packed_mask(collate, config):
    """TRL's padding-free collator with the mask RL's packed rows get (`packed_attention.packed_row_mask`).

    Without a mask, transformers reads the packing off the position ids and builds an L x L block
    mask that the per-sequence attention never reads; an all-ones mask lets it skip that, where
    every layer attends per sequence (a sliding-window layer needs the block mask). The row's
    `cu_seq_lens` still mark the sequences, and the loss and token counts are unchanged."""

    def collate_with_mask(features):
        batch = collate(features)
        if "cu_seq_lens_q" in batch and "attention_mask" not in batch:
            mask = packed_attention.packed_row_mask(batch["input_ids"], config)
            if mask is not None:
                batch["attention_mask"] = mask
        return batch

    return collate_with_mask


def train_sft(model_dir: str | Path, data_parquet: str | Path, out_dir: str | Path, args: SFTArgs = SFTArgs()) -> Path:
    """Fine-tune `model_dir` on `data_parquet`; write the model (or LoRA adapter) to `out_dir`."""
    out_dir = Path(out_dir)
    start = read_record(model_dir)  # before training: a malformed record fails the job at once
    with atomic_dir(out_dir) as tmp:
        trainer = build_trainer(model_dir, data_parquet, tmp / "_trainer", args)
        result = trainer.train()
        _save(trainer, tmp)
        _write_log(trainer.state.log_history, tmp / "sft_log.jsonl")
        write_record(tmp, training_record("sft", [segment(0)], start))
        _remove_tree(tmp / "_trainer")
        print(f"[sft] done: {trainer.state.global_step} steps, train loss {result.training_loss:.4f}, "
              f"saved {'LoRA adapter' if args.lora else 'model'} to {out_dir}", file=sys.stderr, flush=True)
    return out_dir


def _save(trainer, directory: Path) -> None:
    # With LoRA, `trainer.model` is a PeftModel and save_pretrained writes only the adapter.
    trainer.model.save_pretrained(directory, safe_serialization=True)
    trainer.processing_class.save_pretrained(directory)


def _write_log(history: Sequence[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in history))


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _bf16(flag: bool | None) -> bool:
    if flag is not None:
        return flag
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def _quiet_progress_bars() -> None:
    # datasets' map bars and transformers' loading/saving bars are carriage-return spam in a log file.
    if not sys.stderr.isatty():
        import datasets
        import transformers

        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()


def _install_log_lines(trainer) -> None:
    """One plain line per logging step (step/total, loss, lr) instead of dict dumps or tqdm bars."""
    import transformers

    class LogLines(transformers.TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or not state.is_local_process_zero:
                return
            shown = " ".join(f"{k}={_fmt(v)}" for k, v in sorted(logs.items()))
            print(f"[sft] step {state.global_step}/{state.max_steps} {shown}", file=sys.stderr, flush=True)

    if not sys.stderr.isatty():
        trainer.remove_callback(transformers.PrinterCallback)
    trainer.add_callback(LogLines())


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
