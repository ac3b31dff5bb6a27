"""A recipe (one method's settings from config) → the typed settings each stage takes.

Rules pass a recipe to the CLI as one JSON object (`--recipe '{...}'`): Snakemake re-runs a job
when its params change, so editing one recipe re-executes only that recipe's jobs, and the log
holds the whole command. Every key of every section is checked here, against the dataclass or the
method it feeds, with the config key named; `ragrl.workflow.validate` runs the same check on every recipe
before any job starts, so a typo fails `snakemake -n`, not a job hours into a run.

Standard library only (the workflow imports this to plan the DAG).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from dataclasses import dataclass, field
from typing import Any

from ragrl.errors import InputError
from ragrl.methods import Method, get_method
from ragrl.settings import RLConfig, RolloutConfig, SFTArgs

# Recipe keys outside the typed sections (the schema lists the same: tests/unit/test_recipe.py).
TOP_KEYS = ("env", "plugin", "retriever", "train_dataset", "eval_datasets", "topk", "max_queries", "seed",
            "rollout", "sft", "rl", "reward", "turn_reward", "options")
# Keys of `sft` and `rl` that choose a route rather than a trainer setting.
SFT_EXTRA_KEYS = ("enabled", "limit", "source", "teacher", "import", "from")
RL_EXTRA_KEYS = ("limit", "backend", "verl", "rollout_engine", "rollout_serve")
# What generates the local trainer's rollouts (docs/RL.md, "Rollout engine"): hf: `generate` in the
# trainer's process; vllm: a vLLM server beside the trainer, weights synced after every update
# (an error when no vLLM is found); auto: vllm when one is found, else hf with a one-line notice.
ROLLOUT_ENGINES = ("hf", "vllm", "auto")
# `rl.rollout_serve`: how that server is started (ragrl.agent.vllm_sync).
ROLLOUT_SERVE_KEYS = {"python": str, "args": list, "startup_timeout_s": int, "env": dict}
# Server arguments the RL job sets itself and `rollout_serve.args` may not override (vLLM takes the
# last one): the loopback host, because VLLM_SERVER_DEV_MODE's /collective_rpc calls worker methods
# for any caller without an API key; the port, because the job picked a free one and polls it.
ROLLOUT_SERVE_RESERVED_ARGS = ("--host", "--port")
TEACHER_KEYS = {"base_url": str, "model": str, "api_key_env": str, "n": int, "max_per_question": int,
                "batch_size": int, "serve": dict}
# `serve` of a model the job starts itself (ragrl.serving): true, or these settings.
SERVE_KEYS = {"python": str, "args": list, "startup_timeout_s": int, "served_name": str}
IMPORT_KEYS = {"path": str, "format": str}
IMPORT_FORMATS = ("chat_json", "sft_parquet")


@dataclass(frozen=True)
class Recipe:
    name: str
    env: str
    topk: int
    max_queries: int
    rollout: RolloutConfig
    sft: dict = field(default_factory=dict)
    rl: dict = field(default_factory=dict)
    reward: dict = field(default_factory=lambda: {"em": 1.0})
    turn_reward: dict = field(default_factory=dict)  # per-turn reward weights (methods that have them)
    seed: int = 0
    plugin: str | None = None
    options: Any = None  # the method's options dataclass, or None

    @property
    def method(self) -> Method:
        return get_method(self.env, self.plugin)

    def to_config(self) -> dict:
        """The recipe as config writes it: `parse_recipe(recipe.to_config())` gives it back."""
        out = {"env": self.env, "topk": self.topk, "max_queries": self.max_queries, "seed": self.seed,
               "rollout": dataclasses.asdict(self.rollout), "sft": dict(self.sft), "rl": dict(self.rl),
               "reward": dict(self.reward), "turn_reward": dict(self.turn_reward)}
        if self.plugin:
            out["plugin"] = self.plugin
        if self.options is not None:
            out["options"] = dataclasses.asdict(self.options)
        return out

    @property
    def sft_source(self) -> str:
        return self.sft.get("source") or ("gold" if self.method.gold_sft else "teacher")


@functools.cache
def _bool_fields(cls) -> dict[str, bool]:
    """The fields annotated bool or bool | None (Optional[bool]), each with whether None is allowed."""
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):  # a plug-in's annotation that does not resolve: nothing to check
        hints = {}
    return {name: hint is not bool for name, hint in hints.items() if hint is bool or hint == bool | None}


def _build(cls, values: dict, key: str):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise InputError(f"config key '{key}': unknown setting(s) {unknown}; known: {sorted(names)}")
    # A flag of a free-form section (a method's `options`, which the JSON schema cannot type) must be
    # a real boolean: "no" or 0 would otherwise pass as a truthy or falsy setting.
    flags = _bool_fields(cls)
    for name, value in values.items():
        if name in flags and not isinstance(value, bool) and not (flags[name] and value is None):
            raise InputError(f"config key '{key}': {name}={value!r} must be true or false")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise InputError(f"config key '{key}': {exc}") from None


def _section(data: dict, name: str, key: str) -> dict:
    value = data.get(name) or {}
    if not isinstance(value, dict):
        raise InputError(f"config key '{key}.{name}': expected a mapping, got {type(value).__name__}")
    return dict(value)


def parse_recipe(raw: str | dict, name: str = "recipe", key: str | None = None) -> Recipe:
    """The recipe, every section checked (rollout, sft, rl, reward, turn_reward, options); `key` is
    where it sits in config (default recipes.<name>), for error messages."""
    data = json.loads(raw) if isinstance(raw, str) else dict(raw)
    key = key or f"recipes.{name}"
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise InputError(f"config key '{key}': unknown setting(s) {unknown}; known: {sorted(TOP_KEYS)}")
    env, plugin = data.get("env", "search"), data.get("plugin")
    try:
        method = get_method(env, plugin)
    except (ValueError, ImportError, FileNotFoundError) as exc:
        raise InputError(f"config key '{key}.env': {exc}") from None
    rollout = _build(RolloutConfig, _section(data, "rollout", key), f"{key}.rollout")
    if method.rollout is not None:  # e.g. a single-turn method: the same turn budget in SFT, RL and eval
        rollout = method.rollout(rollout)
    reward = _weights(_section(data, "reward", key) or dict(method.default_reward), method.reward_keys,
                      f"{key}.reward", nonempty=True)
    turn_reward = _weights(_section(data, "turn_reward", key), method.turn_reward_keys, f"{key}.turn_reward")
    options_raw = _section(data, "options", key)
    if method.options is None and options_raw:
        raise InputError(f"config key '{key}.options': method {env!r} takes no options, got {sorted(options_raw)}")
    options = _build(method.options, options_raw, f"{key}.options") if method.options is not None else None
    recipe = Recipe(
        name=name, env=env, topk=int(data.get("topk", 3)), max_queries=int(data.get("max_queries", 1)),
        rollout=rollout, sft=_section(data, "sft", key), rl=_section(data, "rl", key), reward=reward,
        turn_reward=turn_reward, seed=int(data.get("seed", 0)), plugin=plugin, options=options,
    )
    sft_args(recipe)
    rl_config(recipe)
    _check_sft_route(recipe)
    _check_rl_route(recipe)
    return recipe


def _weights(raw: dict, known: tuple[str, ...], key: str, nonempty: bool = False) -> dict[str, float]:
    try:
        weights = {str(k): float(v) for k, v in dict(raw).items()}
    except (TypeError, ValueError):
        raise InputError(f"config key '{key}': weights must be numbers, got {raw}") from None
    if (nonempty and not weights) or set(weights) - set(known):
        what = "a non-empty subset" if nonempty else "a subset"
        raise InputError(f"config key '{key}': weights must be {what} of {sorted(known)}, got {sorted(weights)}")
    return weights


def sft_args(recipe: Recipe) -> SFTArgs:
    values = {k: v for k, v in recipe.sft.items() if k not in SFT_EXTRA_KEYS}
    values.setdefault("seed", recipe.seed)
    if "lora_target_modules" in values:
        values["lora_target_modules"] = tuple(values["lora_target_modules"])
    return _build(SFTArgs, values, f"recipes.{recipe.name}.sft")


def rl_config(recipe: Recipe) -> RLConfig:
    # backend (local | verl) and verl (extra verl overrides) choose the trainer, not its settings.
    values = {k: v for k, v in recipe.rl.items() if k not in RL_EXTRA_KEYS}
    values.setdefault("seed", recipe.seed)
    # The trainer scores log-probs of softmax(logits / T): it must be the rollout's temperature.
    values.setdefault("temperature", recipe.rollout.temperature)
    return _build(RLConfig, values, f"recipes.{recipe.name}.rl")


def _check_sft_route(recipe: Recipe) -> None:
    key = f"recipes.{recipe.name}.sft"
    sft, method = recipe.sft, recipe.method
    if sft.get("enabled", True) is False or not method.sft_data:
        return
    source = recipe.sft_source
    if source not in method.sft_sources:
        raise InputError(f"config key '{key}.source': {source!r} is not one of {list(method.sft_sources)} "
                         f"(method {method.name!r})")
    if source == "teacher":
        teacher = dict(sft.get("teacher") or {})
        serve = teacher.pop("serve", None)
        _typed(teacher, TEACHER_KEYS, f"{key}.teacher")
        if "model" not in teacher:
            raise InputError(f"config key '{key}.teacher': teacher trajectories need ['model'] (a model with the "
                             "policy's tokenizer: with base_url, the name an OpenAI-compatible endpoint serves; "
                             "without, a path or HF id the job serves itself), or set sft.source / "
                             "sft.enabled: false")
        _check_serve(serve, "base_url" in teacher, f"{key}.teacher")
    if source == "import":
        spec = _typed(sft.get("import"), IMPORT_KEYS, f"{key}.import")
        if "path" not in spec:
            raise InputError(f"config key '{key}.import.path': the SFT file to import is required")
        if spec.get("format", "chat_json") not in IMPORT_FORMATS:
            raise InputError(f"config key '{key}.import.format': {spec['format']!r} is not one of {IMPORT_FORMATS}")


def serve_settings(endpoint: dict) -> dict | None:
    """The `serve` settings of an endpoint entry ({base_url?, model, serve?}): None for an external
    endpoint (base_url given), else the settings of the server the job starts (`serve: true` = {})."""
    if endpoint.get("base_url"):
        return None
    serve = endpoint.get("serve", True)
    return {} if serve is True else dict(serve)


def _check_serve(serve, has_url: bool, key: str) -> None:
    """`serve` is true/false or a SERVE_KEYS mapping; it and base_url exclude each other."""
    if serve is None or serve is False:
        if serve is False and not has_url:
            raise InputError(f"config key '{key}.serve': false needs '{key}.base_url' (an external endpoint)")
        return
    if has_url:
        raise InputError(f"config key '{key}': base_url (an external endpoint) and serve (a server this job "
                         "starts) exclude each other; keep one")
    if serve is True:
        return
    _check_server_args(_typed(serve, SERVE_KEYS, f"{key}.serve").get("args", []), f"{key}.serve.args")


def _check_server_args(args, key: str, reserved: tuple[str, ...] = ()) -> None:
    """vLLM server arguments: strings, none overriding an option in `reserved` that the job sets."""
    if not all(isinstance(a, str) for a in args):
        raise InputError(f"config key '{key}': vLLM server arguments must be strings, got {args!r}")
    for arg in args:
        # argparse also reads an unambiguous prefix (`--hos`) as the option, and `_` as `-`.
        name = arg.split("=", 1)[0].replace("_", "-")
        hit = [r for r in reserved if len(name) > 2 and r.startswith(name)]
        if hit:
            raise InputError(f"config key '{key}': {arg!r} would override {hit[0]}, which "
                             "the RL job sets itself (the server listens on 127.0.0.1, on a free port it picks)")


def _check_rl_route(recipe: Recipe) -> None:
    backend = recipe.rl.get("backend", "local")
    if backend not in recipe.method.rl_backends:
        raise InputError(f"config key 'recipes.{recipe.name}.rl.backend': {backend!r} is not supported by method "
                         f"{recipe.env!r} (supported: {list(recipe.method.rl_backends)})")
    verl = recipe.rl.get("verl", {})
    if not isinstance(verl, dict):
        raise InputError(f"config key 'recipes.{recipe.name}.rl.verl': expected a mapping of verl overrides")
    key = f"recipes.{recipe.name}.rl"
    engine = recipe.rl.get("rollout_engine", "hf")
    if engine not in ROLLOUT_ENGINES:
        raise InputError(f"config key '{key}.rollout_engine': {engine!r} is not one of {list(ROLLOUT_ENGINES)}")
    if backend != "local" and (engine != "hf" or "rollout_serve" in recipe.rl):
        raise InputError(f"config key '{key}.rollout_engine': the {backend!r} backend generates its own rollouts; "
                         "rollout_engine and rollout_serve are settings of the local trainer")
    serve = _typed(recipe.rl.get("rollout_serve"), ROLLOUT_SERVE_KEYS, f"{key}.rollout_serve")
    _check_server_args(serve.get("args", []), f"{key}.rollout_serve.args", ROLLOUT_SERVE_RESERVED_ARGS)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in serve.get("env", {}).items()):
        raise InputError(f"config key '{key}.rollout_serve.env': environment variables must map strings to "
                         f"strings, got {serve['env']!r}")


def _typed(raw, spec: dict[str, type], key: str) -> dict:
    value = raw or {}
    if not isinstance(value, dict):
        raise InputError(f"config key '{key}': expected a mapping, got {type(value).__name__}")
    for k, v in value.items():
        if k not in spec:
            raise InputError(f"config key '{key}.{k}': unknown setting; known: {sorted(spec)}")
        if not isinstance(v, spec[k]) or isinstance(v, bool):
            raise InputError(f"config key '{key}.{k}': expected {spec[k].__name__}, got {v!r}")
    return value


def stage_keys() -> dict[str, tuple[str, ...]]:
    """Every key each recipe section accepts (the schema documents the same; a test compares)."""
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    return {"rollout": names(RolloutConfig), "sft": names(SFTArgs) + SFT_EXTRA_KEYS,
            "rl": names(RLConfig) + RL_EXTRA_KEYS}


# --- HARR (config `harr:`): the retriever is the policy, a trained agent run is the frozen generator.

HARR_KEYS = ("generator", "index", "train_dataset", "eval_datasets", "filter", "filter_limit", "filter_keep",
             "filter_seed", "train_mix", "recall_k", "environment", "encoder", "train")
# The evaluated runs: the frozen encoder on query-only states; the frozen encoder on HARR's
# history-aware states (the baseline HARR's training starts from: all-MiniLM never saw such text,
# and the state format alone changes the generator's answers); HARR's encoder; and the ablation
# trained and evaluated on the query alone. run id -> (trained?, history-aware states?)
HARR_FEATURES = ("history",)  # the flags after `trained?`, by name
HARR_RUNS = {"harr_frozen": (False, False), "harr_frozen_history": (False, True), "harr": (True, True),
             "harr_no_history": (True, False)}


def harr_lineage(runs: dict[str, tuple[bool, ...]]) -> dict[str, dict[str, str | None]]:
    """Each HARR run's lineage (ragrl.results.paired) from its flags (trained?, *features): a
    trained encoder starts from the frozen encoder under the same features (what it was before
    training); the frozen encoder under other features is a variant of the plain frozen run; a
    trained run lacking a feature the full run has is that run's ablation."""
    frozen = {tuple(features): run for run, (trained, *features) in runs.items() if not trained}
    plain = next((run for features, run in frozen.items() if not any(features)), None)
    full = next((run for run, (trained, *features) in runs.items() if trained and all(features)), None)
    out: dict[str, dict[str, str | None]] = {}
    for run, (trained, *features) in runs.items():
        if trained:
            out[run] = {"family": "harr", "step": "rl", "start_run": frozen.get(tuple(features), plain),
                        "ablation_of": full if not all(features) else None}
        else:
            # A variant's step names what it changes (as `oracle`, `no_retrieval`): "history vs base".
            step = "base" if run == plain else "_".join(n for n, on in zip(HARR_FEATURES, features) if on) or "base"
            out[run] = {"family": "harr", "step": step, "variant_of": plain if run != plain else None}
    return out


# harr.generator as a mapping: a run of this workflow (`run`) or an outside checkpoint (`model`, with
# the `recipe` settings it runs under: env, topk, rollout budgets), and how it is served: `base_url`
# (an external OpenAI-compatible endpoint, `served_name` its model name), `serve` (a vLLM server each
# job starts on it, ragrl.serving), or neither (loaded in process, HF).
HARR_GENERATOR_KEYS = {"run": str, "model": str, "recipe": dict, "base_url": str, "served_name": str}


def harr_generator_spec(raw: Any, key: str = "harr.generator") -> dict:
    """harr.generator normalised to a mapping: a plain string names a run ({"run": name})."""
    if isinstance(raw, str):
        if not raw:
            raise InputError(f"config key '{key}': a run name or a mapping is required, got ''")
        return {"run": raw}
    if not isinstance(raw, dict):
        raise InputError(f"config key '{key}': a run name or a mapping ({sorted(HARR_GENERATOR_KEYS)} and serve), "
                         f"got {raw!r}")
    data = dict(raw)
    serve = data.pop("serve", None)
    spec = _typed(data, HARR_GENERATOR_KEYS, key)
    if ("run" in spec) == ("model" in spec):
        raise InputError(f"config key '{key}': name exactly one of run (a run of this workflow) and model "
                         f"(an outside checkpoint), got {sorted(spec)}")
    if "model" in spec:
        if "recipe" not in spec:
            raise InputError(f"config key '{key}.recipe': model {spec['model']!r} needs the recipe settings it runs "
                             "under (env, topk, rollout, ...), as a recipes entry has them")
        # Normalised with the method it resolves to, so the workflow reads env as from a recipe entry.
        spec["recipe"] = {**spec["recipe"], "env": parse_recipe(spec["recipe"], "generator", key=f"{key}.recipe").env}
    elif "recipe" in spec:
        raise InputError(f"config key '{key}.recipe': run {spec['run']!r} brings its own recipe; drop this key")
    if serve not in (None, False):
        _check_serve(serve, "base_url" in spec, key)
        spec["serve"] = serve
    if "served_name" in spec and "base_url" not in spec:
        raise InputError(f"config key '{key}.served_name': only with base_url (a server this job starts takes "
                         "serve.served_name)")
    return spec


@dataclass(frozen=True)
class HarrRecipe:
    generator: str | dict
    index: str
    train_dataset: str
    eval_datasets: tuple[str, ...]
    environment: Any
    encoder: Any
    train: Any
    filter: bool = True
    filter_limit: int | None = None
    # Stop the filter once this many questions are kept (HARR's filter_data.py --num_samples), and
    # roll out the questions in the order np.random.default_rng(filter_seed).permutation gives
    # (the order of its `dataset.shuffle(seed=...)`), or file order when None.
    filter_keep: int | None = None
    filter_seed: int | None = None
    # Question type (the QA row's metadata.type) -> at most that many kept questions of it (None:
    # all the filter keeps); types not named are not rolled out. None: every question.
    train_mix: tuple[tuple[str, int | None], ...] | None = None
    recall_k: tuple[int, ...] = (1, 3, 5)

    def to_config(self) -> dict:
        return {"generator": self.generator, "index": self.index, "train_dataset": self.train_dataset,
                "eval_datasets": list(self.eval_datasets), "filter": self.filter, "filter_limit": self.filter_limit,
                # only when set: a job's params are this dict, and existing results should not re-run
                **({"filter_keep": self.filter_keep} if self.filter_keep is not None else {}),
                **({"filter_seed": self.filter_seed} if self.filter_seed is not None else {}),
                "train_mix": None if self.train_mix is None else dict(self.train_mix),
                "recall_k": list(self.recall_k), "environment": dataclasses.asdict(self.environment),
                "encoder": dataclasses.asdict(self.encoder), "train": dataclasses.asdict(self.train)}


def parse_harr(raw: str | dict, key: str = "harr") -> HarrRecipe:
    """HARR's settings, every key of every section checked against its dataclass (ragrl.settings)."""
    from ragrl.settings import EncoderTraining, HarrEnvironment, RetrieverTrainConfig

    data = json.loads(raw) if isinstance(raw, str) else dict(raw)
    unknown = sorted(set(data) - set(HARR_KEYS))
    if unknown:
        raise InputError(f"config key '{key}': unknown setting(s) {unknown}; known: {sorted(HARR_KEYS)}")
    harr_generator_spec(data.get("generator"), f"{key}.generator")
    for name in ("index", "train_dataset"):
        if not isinstance(data.get(name), str) or not data[name]:
            raise InputError(f"config key '{key}.{name}': a name is required, got {data.get(name)!r}")
    evals = data.get("eval_datasets") or []
    if not isinstance(evals, list) or not evals or not all(isinstance(d, str) and d for d in evals):
        raise InputError(f"config key '{key}.eval_datasets': a non-empty list of dataset names, got {evals!r}")
    ks = data.get("recall_k", [1, 3, 5])
    # Empty: no recall jobs (a corpus whose QA rows name no supporting passages, e.g. wiki-18 + FlashRAG).
    if not isinstance(ks, list) or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in ks):
        raise InputError(f"config key '{key}.recall_k': a list of integers >= 1 ([]: no recall), got {ks!r}")
    for name in ("filter_limit", "filter_keep"):
        n = data.get(name)
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise InputError(f"config key '{key}.{name}': an integer >= 1 or null, got {n!r}")
    seed = data.get("filter_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise InputError(f"config key '{key}.filter_seed': an integer >= 0 or null (file order), got {seed!r}")
    if not isinstance(data.get("filter", True), bool):
        raise InputError(f"config key '{key}.filter': true or false, got {data['filter']!r}")
    mix = data.get("train_mix")
    if mix is not None:
        if not isinstance(mix, dict) or not mix:
            raise InputError(f"config key '{key}.train_mix': a mapping of question type -> count or null, or null, "
                             f"got {mix!r}")
        for kind, n in mix.items():
            if not isinstance(kind, str) or not kind:
                raise InputError(f"config key '{key}.train_mix': question types are non-empty strings, got {kind!r}")
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
                raise InputError(f"config key '{key}.train_mix.{kind}': an integer >= 1 or null (all kept), got {n!r}")
        mix = tuple(mix.items())
    encoder = _section(data, "encoder", key)
    if isinstance(encoder.get("lora_target_modules"), list):
        encoder["lora_target_modules"] = tuple(encoder["lora_target_modules"])
    return HarrRecipe(
        generator=data["generator"], index=data["index"], train_dataset=data["train_dataset"],
        eval_datasets=tuple(evals), filter=data.get("filter", True), filter_limit=data.get("filter_limit"),
        filter_keep=data.get("filter_keep"), filter_seed=seed, train_mix=mix,
        recall_k=tuple(ks),
        environment=_build(HarrEnvironment, _section(data, "environment", key), f"{key}.environment"),
        encoder=_build(EncoderTraining, encoder, f"{key}.encoder"),
        train=_build(RetrieverTrainConfig, _section(data, "train", key), f"{key}.train"))
