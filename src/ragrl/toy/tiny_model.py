"""A tiny, randomly initialised Qwen2-style chat model for end-to-end tests of the workflow.

The point is not quality but shape: the model must load anywhere a real Qwen2 checkpoint loads (HF
auto classes, vLLM's CPU backend, TRL) with no remote code, speak ChatML, and treat the RAG
protocol tags as atomic tokens, so that rollout parsing and assistant-only losses are exercised
exactly as they would be with a real model, in seconds and on a CPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from ragrl.errors import InputError
from ragrl.io import atomic_dir

PROTOCOL_TAGS: tuple[str, ...] = (
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
    "<answer>",
    "</answer>",
    "<kg-query>",
    "</kg-query>",
)
CHAT_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ENDOFTEXT, IM_START, IM_END = CHAT_TOKENS

# eos is <|im_end|> (as in Qwen2.5-Instruct) so that `generate` stops at the end of an assistant
# turn instead of running on into a hallucinated next turn; pad is <|endoftext|> so that padding
# never looks like a turn end to a loss mask. generation_config lists both as stop ids because
# plain-text (non-chat) documents end with <|endoftext|>.
EOS_TOKEN = IM_END
PAD_TOKEN = ENDOFTEXT

REQUIRED_HEAD_DIM = 64  # vLLM's CPU attention kernel only supports a few head sizes; 64 is the smallest
VOCAB_MULTIPLE = 64  # embedding rows are padded up to this, as real checkpoints do, for kernel-friendly shapes

# Qwen-style ChatML. Assistant content and its <|im_end|> sit inside {% generation %} so that
# `return_assistant_tokens_mask=True` marks exactly what the model should learn to emit: the
# closing <|im_end|> included (it must learn to stop), the role header and trailing "\n" excluded.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    vocab_size: int = 2000
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 688
    max_position_embeddings: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_heads <= 0 or self.hidden_size != REQUIRED_HEAD_DIM * self.num_heads:
            raise InputError(
                f"num_heads={self.num_heads} with hidden_size={self.hidden_size} gives head_dim "
                f"{self.hidden_size / max(self.num_heads, 1):g}; head_dim must be {REQUIRED_HEAD_DIM} "
                "(vLLM's CPU attention kernel rejects small heads such as 16), so set hidden_size = 64 * num_heads"
            )
        if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise InputError(
                f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads} (grouped-query attention)"
            )
        reserved = len(CHAT_TOKENS) + len(PROTOCOL_TAGS) + 256  # the byte alphabet cannot be merged away
        if self.vocab_size <= reserved:
            raise InputError(f"vocab_size={self.vocab_size} must exceed {reserved} (byte alphabet plus added tokens)")


# transformers' Qwen2Tokenizer split rule (models/qwen2/tokenization_qwen2.py, PRETOKENIZE_REGEX):
# digits one by one, letters in runs, punctuation runs, whitespace handling of tiktoken's cl100k.
QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                           r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


# How often each environment's prompt is repeated in the tokenizer corpus: it opens every
# training sequence, so weighing it like one passage would leave it split into characters.
PROMPT_REPEATS = 50


def with_prompt_text(texts: Iterable[str]) -> list[str]:
    """`texts` plus the agent prompts and tool calls, so their words become merges of the tokenizer."""
    from ragrl.agent.protocol import DEFAULT_INSTRUCTION, DEFAULT_MULTI_QUERY_INSTRUCTION
    from ragrl.kg.environment import DEFAULT_KG_INSTRUCTION
    from ragrl.kg.ops import OPERATIONS

    calls = " ".join(f'{name}("' for name in OPERATIONS)
    prompts = [DEFAULT_INSTRUCTION, DEFAULT_MULTI_QUERY_INSTRUCTION, DEFAULT_KG_INSTRUCTION, calls]
    return list(texts) + prompts * PROMPT_REPEATS


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> transformers.PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer of `vocab_size` tokens in total (fewer if the corpus runs out of merges)."""
    backend = _train_bpe(texts, vocab_size - len(PROTOCOL_TAGS))
    # Not "special": skip_special_tokens=True must keep the tags, since the rollout parser reads
    # them from decoded text (Qwen3 treats <think> the same way). normalized=False matches them in
    # the raw text, before byte-level pre-tokenisation could glue them to neighbouring characters.
    backend.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in PROTOCOL_TAGS])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        # Listed so that all_special_tokens (what TRL and vLLM consult) covers every chat token.
        extra_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        # The word-piece clean-up would delete spaces before punctuation and break round-trips.
        clean_up_tokenization_spaces=False,
    )


def _train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    backend = Tokenizer(models.BPE())
    # Qwen2's normalizer and pre-tokenizer, exactly: config.json says qwen2, so AutoTokenizer
    # reloads the saved tokenizer as Qwen2Tokenizer, which installs these two; merges learned
    # under any other split rule (GPT-2's, say) would then encode differently after a reload.
    # No prefix space: "abc" at the start of a text must encode the same as after a special token,
    # and decode must return exactly the input.
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    # trim_offsets=False keeps character offsets exact, which the assistant-mask computation relies on.
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(CHAT_TOKENS),
        # The full byte alphabet makes every string encodable, whatever the training texts contain.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return backend


def build_model(tokenizer: transformers.PreTrainedTokenizerBase, spec: TinyModelSpec) -> transformers.Qwen2ForCausalLM:
    """A randomly initialised Qwen2 model sized for `tokenizer`; the same spec gives the same weights."""
    config = _model_config(tokenizer, spec)
    # fork_rng: seed locally so callers' global RNG streams are left as they were.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = transformers.Qwen2ForCausalLM(config)
    model.generation_config = _generation_config(tokenizer)
    return model.eval()


def _model_config(tokenizer: transformers.PreTrainedTokenizerBase, spec: TinyModelSpec) -> transformers.Qwen2Config:
    vocab_size = -(-len(tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    pad_id = tokenizer.pad_token_id
    return transformers.Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.hidden_size // spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        # The tokenizer prepends no BOS; Qwen2 checkpoints still name <|endoftext|> as bos, so do we.
        bos_token_id=pad_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad_id,
        dtype="float32",
    )


def _generation_config(tokenizer: transformers.PreTrainedTokenizerBase) -> transformers.GenerationConfig:
    return transformers.GenerationConfig(
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id,
    )


def build_tiny(texts: Iterable[str], out_dir: str | Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Train the tokenizer, build the model and write both to `out_dir` in HF format, all or nothing."""
    out_dir = Path(out_dir)
    tokenizer = train_tokenizer(texts, spec.vocab_size)
    # Saved with the tokenizer so truncation=True (TRL, vLLM) cuts at what the model can attend to.
    tokenizer.model_max_length = spec.max_position_embeddings
    model = build_model(tokenizer, spec)
    with atomic_dir(out_dir) as tmp:
        save_tiny_model(tokenizer, model, spec, tmp)
    return out_dir


def save_tiny_model(tokenizer, model, spec: TinyModelSpec, directory: Path) -> None:
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory, safe_serialization=True)
    # Provenance: the spec is not recoverable from config.json alone (seed, requested vocab size).
    (directory / "tiny_model_spec.json").write_text(json.dumps(asdict(spec), indent=2, sort_keys=True) + "\n")


def generate_text(model_dir: str | Path, prompt: str, max_new_tokens: int = 16, seed: int | None = 0) -> str:
    """Continue `prompt` with the saved model: seeded sampling, or greedy when seed is None. CPU only."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        if seed is not None:
            torch.manual_seed(seed)
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=seed is not None)
    new_tokens = output[0, inputs["input_ids"].shape[1] :]
    return tokenizer.decode(new_tokens, skip_special_tokens=True)
