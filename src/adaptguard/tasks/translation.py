"""Compositional translation tasks (Xu's thesis §4.3.2, §9.2): English sentences of a small COGS-like
grammar (Kim & Linzen 2020) translated to chain-structured logical forms, as in COFE (An et al. 2023).

Source grammar (seeded, fixed lexicon): proper names (`Liam`) and common nouns with a determiner
(`the dog`, `a cat`); place nouns only inside prepositional phrases (`the cat in the box`,
`a girl beside a table`, prepositions in/on/beside); verbs of five frames:

=============  ======================================  ===============================
frame          sentence                                target clause
=============  ======================================  ===============================
unergative     The dog slept .                         SLEEP (DOG, NONE, NONE)
unaccusative   The cake grew .                         GROW (NONE, CAKE, NONE)
transitive     The dog helped the rose .               HELP (DOG, ROSE, NONE)
               The rose was helped by the dog .        HELP (DOG, ROSE, NONE)
               The rose was helped .                   HELP (NONE, ROSE, NONE)
dative         Emma gave the cake to Liam .            GIVE (EMMA, CAKE, LIAM)
               Emma gave Liam the cake .               GIVE (EMMA, CAKE, LIAM)
               The cake was given to Liam by Emma .    GIVE (EMMA, CAKE, LIAM)
               Liam was given the cake .               GIVE (NONE, CAKE, LIAM)
ccomp          Liam hoped that the dog preferred .     HOPE (LIAM, NONE, NONE) CCOMP PREFER (DOG, NONE, NONE)
=============  ======================================  ===============================

Target (§9.2): each clause is `PREDICATE (AGENT, THEME, RECIPIENT)`, the predicate the verb's
lemma, every token upper-case, a missing role `NONE`, determiners dropped; clauses are joined by
`CCOMP`. A PP-modified noun is rendered as its words without determiners: `the cat in the box` ->
`CAT IN BOX` (so `The cat in the box slept .` -> `SLEEP (CAT IN BOX, NONE, NONE)`).

Primitives (the units of the coverage principle) are the lower-case noun lemmas (names, common and
place nouns), the verb lemmas, and each PP phrase as a unit (`cat in box`). A noun's *position* is
`subject` (the clause's grammatical subject) or `object` (any noun after the verb, `by`/`to` phrases
included); a verb's is `active` or `passive`.

Tasks and settings (how demonstrations and queries differ):

T1, phrase recombination + longer chain (COFE PhraReco, LongChain); active voice only, no passives.
  Demonstrations of `simple1`, `simple2`, `composite` come from one pool: 1-2 clauses, PP-modified
  nouns only in object position (a transitive/dative last clause has a PP on its theme or recipient
  with probability 1/2). Queries:
  - simple1: 1-2 clauses, the sentence subject PP-modified (a PP subject never seen in demos);
  - simple2: 3-4 clauses, no PP (a chain longer than any demo's);
  - composite: 3-4 clauses with the sentence subject PP-modified (both at once);
  - composite_icl: queries drawn as for composite (same seed stream), demonstrations drawn from the
    composite query distribution.
T2, passive->active + object->subject (COGS generalisations, Kim & Linzen 2020 Table 2); no PPs.
  Every setting draws the same query stream (with the defaults, identical queries): one active
  transitive or dative clause with a common-noun subject N and verb V. Demos come from a pool of
  1-2 clause sentences of all frames (transitive and dative clauses passive with probability 1/2,
  30% of the passives without a `by` agent):
  - simple1 (passive->active, as in COGS: the verb is seen only in the passive voice and tested in
    the active voice): no demo uses V in the active voice;
  - simple2 (object->subject): no demo has N as a subject (N is seen only as an object);
  - composite: both restrictions at once (each demo belongs to the demos of a simple task);
  - composite_icl: demos drawn from the query distribution, and some demo uses V in the active
    voice and some demo has N as a subject.

Demonstrations (k per query) are chosen greedily from the pool by the primitive-coverage principle
(An et al. 2023): repeatedly the allowed pool sentence covering most still-uncovered primitives of
the query (ties broken at random), then random allowed sentences up to k, then shuffled. A query
whose primitives k demonstrations cannot cover is redrawn, as is a repeated query; if fewer than
`n_test` queries succeed within 4·n_test + 100 draws (k too small: k=1 covers no T1 composite query,
k=2 about 4% of them), `build_prompts` raises ValueError.

Metric: word error rate (jiwer; whitespace words; edits / words of the reference; lower is
better; can exceed 1 with insertions) on the first non-blank line of the prediction; an empty
prediction scores 1.0 (every reference word deleted); plus strict exact match.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datasets import Dataset

TASKS = ("t1", "t2")
SETTINGS = ("simple1", "simple2", "composite", "composite_icl")

PROPER = ("Liam", "Emma", "Noah", "Olivia", "Ava", "Mason", "Lucas", "Mia", "Ella", "James")
COMMON = ("dog", "cat", "rose", "cake", "girl", "boy", "bird", "teacher", "baby", "cookie", "lion", "monkey",
          "hero", "donut")
PLACES = ("box", "table", "bed", "car", "stage")
PREPOSITIONS = ("in", "on", "beside")
DETERMINERS = ("the", "a")

# lemma -> (past, past participle, frame)
VERBS: dict[str, tuple[str, str, str]] = {
    **{v: (p, p, "unergative") for v, p in [("sleep", "slept"), ("smile", "smiled"), ("dance", "danced"),
                                            ("laugh", "laughed"), ("prefer", "preferred")]},
    **{v: (p, p, "unaccusative") for v, p in [("grow", "grew"), ("roll", "rolled"), ("freeze", "froze"),
                                              ("break", "broke")]},
    **{v: (p, pp, "transitive") for v, p, pp in [
        ("help", "helped", "helped"), ("like", "liked", "liked"), ("see", "saw", "seen"),
        ("find", "found", "found"), ("paint", "painted", "painted"), ("admire", "admired", "admired"),
        ("eat", "ate", "eaten"), ("push", "pushed", "pushed")]},
    **{v: (p, pp, "dative") for v, p, pp in [
        ("give", "gave", "given"), ("send", "sent", "sent"), ("offer", "offered", "offered"),
        ("hand", "handed", "handed"), ("lend", "lent", "lent")]},
    **{v: (p, p, "ccomp") for v, p in [("hope", "hoped"), ("say", "said"), ("believe", "believed"),
                                       ("think", "thought"), ("know", "knew"), ("notice", "noticed")]},
}
# roles each frame needs (active voice; a passive may drop the agent)
_ROLES = {"unergative": ("agent",), "unaccusative": ("theme",), "transitive": ("agent", "theme"),
          "dative": ("agent", "theme", "recipient"), "ccomp": ("agent",)}
POOL_SIZE = 3000


@dataclass(frozen=True)
class NP:
    """A noun phrase: `noun` is a lower-case lemma (names are capitalised when spoken), `det` "the"/"a"
    for common nouns and "" for names, `pp` an optional (preposition, determiner, place noun)."""

    noun: str
    det: str = ""
    pp: tuple[str, str, str] | None = None


@dataclass(frozen=True)
class Clause:
    """One clause: verb lemma, semantic roles, voice, dative word order, and an optional complement
    clause (only for ccomp verbs: `agent` hoped that `ccomp`)."""

    verb: str
    agent: NP | None = None
    theme: NP | None = None
    recipient: NP | None = None
    passive: bool = False
    double_object: bool = False
    ccomp: Clause | None = None


def _frame(clause: Clause) -> str:
    if clause.verb not in VERBS:
        raise ValueError(f"verb={clause.verb!r} is not in the lexicon; valid: {', '.join(sorted(VERBS))}")
    frame = VERBS[clause.verb][2]
    given = {r for r in ("agent", "theme", "recipient") if getattr(clause, r) is not None}
    need = set(_ROLES[frame]) - ({"agent"} if clause.passive else set())
    if not need <= given <= set(_ROLES[frame]) or (frame == "ccomp") != (clause.ccomp is not None) \
            or (clause.passive and frame not in ("transitive", "dative")) \
            or (clause.double_object and frame != "dative"):
        raise ValueError(f"clause {clause} does not fit the {frame} frame of {clause.verb!r} (roles "
                         f"{_ROLES[frame]}; passive only for transitive/dative verbs, double object only dative)")
    return frame


def chain(clause: Clause) -> list[Clause]:
    """The clauses of a sentence, main clause first."""
    return [clause] + (chain(clause.ccomp) if clause.ccomp else [])


def positions(clause: Clause) -> list[tuple[NP, str]]:
    """The noun phrases of one clause (not its complement) with their position, `subject` or `object`."""
    frame = _frame(clause)
    subject = ("recipient" if clause.double_object else "theme") if clause.passive \
        else "theme" if frame == "unaccusative" else "agent"
    return [(getattr(clause, r), "subject" if r == subject else "object") for r in ("agent", "theme", "recipient")
            if getattr(clause, r) is not None]


def _say(np: NP) -> str:
    head = f"{np.det} {np.noun}" if np.det else np.noun.capitalize()
    return head if np.pp is None else f"{head} {' '.join(np.pp)}"


def _say_clause(c: Clause) -> str:
    past, participle, frame = VERBS[c.verb][0], VERBS[c.verb][1], _frame(c)
    if frame == "ccomp":
        return f"{_say(c.agent)} {past} that {_say_clause(c.ccomp)}"
    if frame in ("unergative", "unaccusative"):
        return f"{_say(c.agent or c.theme)} {past}"
    by = f" by {_say(c.agent)}" if c.agent else ""
    if frame == "transitive":
        return f"{_say(c.theme)} was {participle}{by}" if c.passive else f"{_say(c.agent)} {past} {_say(c.theme)}"
    if c.passive:
        return (f"{_say(c.recipient)} was {participle} {_say(c.theme)}{by}" if c.double_object
                else f"{_say(c.theme)} was {participle} to {_say(c.recipient)}{by}")
    return (f"{_say(c.agent)} {past} {_say(c.recipient)} {_say(c.theme)}" if c.double_object
            else f"{_say(c.agent)} {past} {_say(c.theme)} to {_say(c.recipient)}")


def realize(clause: Clause) -> str:
    """The English sentence, COGS style: first letter upper-case, ` .` at the end."""
    text = _say_clause(clause)
    return f"{text[0].upper()}{text[1:]} ."


def _arg(np: NP | None) -> str:
    if np is None:
        return "NONE"
    words = [np.noun] + ([np.pp[0], np.pp[2]] if np.pp else [])
    return " ".join(words).upper()


def translate(clause: Clause) -> str:
    """The chain-structured target, e.g. `HOPE (LIAM, NONE, NONE) CCOMP PREFER (DOG, NONE, NONE)`."""
    _frame(clause)
    head = f"{clause.verb.upper()} ({_arg(clause.agent)}, {_arg(clause.theme)}, {_arg(clause.recipient)})"
    return head if clause.ccomp is None else f"{head} CCOMP {translate(clause.ccomp)}"


def features(clause: Clause) -> frozenset[str]:
    """Primitives (`dog`, `help`, `cat in box`) plus their positions (`dog@subject`, `help@passive`,
    `cat in box@object`, `pp@subject` for any PP-modified subject)."""
    out: set[str] = set()
    for c in chain(clause):
        out |= {c.verb, f"{c.verb}@{'passive' if c.passive else 'active'}"}
        for np, pos in positions(c):
            out |= {np.noun, f"{np.noun}@{pos}"}
            if np.pp:
                phrase = f"{np.noun} {np.pp[0]} {np.pp[2]}"
                out |= {np.pp[2], phrase, f"{phrase}@{pos}", f"pp@{pos}"}
    return frozenset(out)


def primitives(clause: Clause) -> list[str]:
    """The sorted primitives of a sentence: noun and verb lemmas and PP phrases."""
    return sorted(f for f in features(clause) if "@" not in f)


def item(clause: Clause) -> dict:
    """`{"input": sentence, "output": logical form, "primitives": [...]}`."""
    return {"input": realize(clause), "output": translate(clause), "primitives": primitives(clause)}


# ---- sampling -------------------------------------------------------------------------------------

class _Nouns:
    """Draws noun phrases with distinct head nouns within one sentence (no `the dog helped the dog`)."""

    def __init__(self, rng: random.Random, proper_p: float = 0.3):
        self.rng, self.proper_p, self.used = rng, proper_p, set()

    def np(self, *, common: bool = False, pp: bool = False) -> NP:
        proper = not (common or pp) and self.rng.random() < self.proper_p
        noun = self.rng.choice([n for n in (PROPER if proper else COMMON) if n.lower() not in self.used])
        self.used.add(noun.lower())
        if proper:
            return NP(noun.lower())
        place = (self.rng.choice(PREPOSITIONS), self.rng.choice(DETERMINERS), self.rng.choice(PLACES)) if pp else None
        return NP(noun, self.rng.choice(DETERMINERS), place)


def _verb(rng: random.Random, *frames: str) -> str:
    return rng.choice([v for v, (_, _, f) in VERBS.items() if f in frames])


def _tail(rng: random.Random, nouns: _Nouns, subject: NP | None, frames: tuple[str, ...], *,
          passive_p: float = 0.0, pp_object_p: float = 0.0) -> Clause:
    """A clause without complement; `subject` (if given) is its subject, in the active voice; with
    probability `pp_object_p` its theme or recipient carries a PP."""
    verb = _verb(rng, *frames)
    frame = VERBS[verb][2]
    if frame == "unergative":
        return Clause(verb, agent=subject or nouns.np())
    if frame == "unaccusative":
        return Clause(verb, theme=subject or nouns.np())
    passive = subject is None and rng.random() < passive_p
    agent = None if passive and rng.random() < 0.3 else subject or nouns.np()
    pp_role = rng.choice(["theme", "recipient"][: 1 + (frame == "dative")]) if rng.random() < pp_object_p else None
    theme = nouns.np(pp=pp_role == "theme")
    recipient = nouns.np(pp=pp_role == "recipient") if frame == "dative" else None
    return Clause(verb, agent, theme, recipient, passive, frame == "dative" and rng.random() < 0.5)


def _sentence(rng: random.Random, n_clauses: int, tail: Callable[[_Nouns, NP | None], Clause], *,
              pp_subject: bool = False) -> Clause:
    """`n_clauses - 1` ccomp clauses above `tail(nouns, subject)`; `pp_subject` puts a PP on the
    sentence (main clause) subject."""
    nouns = _Nouns(rng)
    subject = nouns.np(pp=True) if pp_subject else None

    def build(n: int, subj: NP | None) -> Clause:
        if n == 1:
            return tail(nouns, subj)
        return Clause(_verb(rng, "ccomp"), agent=subj or nouns.np(), ccomp=build(n - 1, None))

    return build(n_clauses, subject)


_SIMPLE = ("unergative", "unaccusative", "transitive", "dative")


def _t1(rng: random.Random, clauses: tuple[int, ...], pp_subject: bool, pp_object_p: float) -> Clause:
    tail = lambda nouns, subj: _tail(rng, nouns, subj, _SIMPLE, pp_object_p=pp_object_p)
    return _sentence(rng, rng.choice(clauses), tail, pp_subject=pp_subject)


def _t2_query(rng: random.Random) -> Clause:
    nouns = _Nouns(rng)
    return _tail(rng, nouns, nouns.np(common=True), ("transitive", "dative"))


def _t2_pool(rng: random.Random) -> Clause:
    tail = lambda nouns, subj: _tail(rng, nouns, subj, _SIMPLE, passive_p=0.5)
    return _sentence(rng, rng.choice((1, 2)), tail)


def _samplers(task: str, setting: str) -> tuple[Callable, Callable]:
    """(query sampler, pool sampler) of a task and setting, each `rng -> Clause`."""
    if task == "t2":
        return _t2_query, (_t2_query if setting == "composite_icl" else _t2_pool)
    clauses, pp_subject = {"simple1": ((1, 2), True), "simple2": ((3, 4), False)}.get(setting, ((3, 4), True))
    query = lambda r: _t1(r, clauses, pp_subject, 0.0)
    return query, (query if setting == "composite_icl" else lambda r: _t1(r, (1, 2), False, 0.5))


def _targets(task: str, setting: str, q: Clause) -> tuple[set[str], set[str]]:
    """(features the demos must cover, features no demo may have) for query `q`."""
    targets, forbid = set(primitives(q)), set()
    if task == "t2":
        verb, subject = f"{q.verb}@active", f"{q.agent.noun}@subject"
        if setting == "composite_icl":
            targets |= {verb, subject}
        else:
            forbid = {"simple1": {verb}, "simple2": {subject}, "composite": {verb, subject}}[setting]
    return targets, forbid


# ---- prompts --------------------------------------------------------------------------------------

def _check(task: str, setting: str, k: int, n_test: int, pool_size: int) -> None:
    if task not in TASKS:
        raise ValueError(f"task={task!r} is unknown; valid: {', '.join(TASKS)}")
    if setting not in SETTINGS:
        raise ValueError(f"setting={setting!r} is unknown; valid: {', '.join(SETTINGS)}")
    if not isinstance(n_test, int) or n_test < 1:
        raise ValueError(f"n_test={n_test!r} must be a positive integer (number of test queries)")
    if not isinstance(pool_size, int) or pool_size < 1:
        raise ValueError(f"pool_size={pool_size!r} must be a positive integer")
    if not isinstance(k, int) or not 1 <= k <= pool_size:
        raise ValueError(f"k={k!r} must be an integer in 1..pool_size={pool_size} (demonstrations per prompt "
                         "are drawn from the pool)")


def _select(masks: list[int], inputs: list[str], order: list[int], query: str, target: int, forbid: int,
            k: int, rng: random.Random) -> list[int] | None:
    """Greedy primitive cover then random fill (pool indices, shuffled); None if k demos cannot cover."""
    start = rng.randrange(len(order))
    allowed = [i for i in order[start:] + order[:start] if not masks[i] & forbid and inputs[i] != query]
    if len(allowed) < k:
        return None
    chosen, left = [], target
    hits = [i for i in allowed if masks[i] & left]
    while left:
        if len(chosen) == k or not hits:
            return None
        best = max(hits, key=lambda i: (masks[i] & left).bit_count())  # first maximum: random tie-break
        chosen.append(best)
        left &= ~masks[best]
        hits = [i for i in hits if masks[i] & left]
    taken = set(chosen)
    chosen += [i for i in allowed if i not in taken][: k - len(chosen)]
    rng.shuffle(chosen)
    return chosen


def format_prompt(demos: list[dict], query: str) -> str:
    """`input: ...\\noutput: ...\\n\\n` per demonstration, then `input: <query>\\noutput:`."""
    shots = "".join(f"input: {d['input']}\noutput: {d['output']}\n\n" for d in demos)
    return f"{shots}input: {query}\noutput:"


def build_prompts(task: str, setting: str, *, k: int = 10, n_test: int = 800, seed: int = 0,
                  pool_size: int = POOL_SIZE) -> list[dict]:
    """`n_test` distinct queries of `task` ("t1"/"t2") in `setting`, each with k demonstrations that
    cover its primitives: dicts `prompt`, `input`, `output`, `primitives`, `task`, `setting`."""
    _check(task, setting, k, n_test, pool_size)
    sample_query, sample_pool = _samplers(task, setting)
    pool_rng = random.Random(f"{seed}:{task}:pool:{'icl' if setting == 'composite_icl' else 'base'}")
    pool = [item(c) | {"features": features(c)} for c in [sample_pool(pool_rng) for _ in range(pool_size)]]
    index: dict[str, int] = {}
    mask = lambda feats: sum(1 << index.setdefault(f, len(index)) for f in feats)
    masks, inputs = [mask(p["features"]) for p in pool], [p["input"] for p in pool]
    order = list(range(pool_size))
    select_rng = random.Random(f"{seed}:{task}:{setting}:select")
    select_rng.shuffle(order)
    # the T2 settings share one query stream, T1's composite and composite_icl another
    query_rng = random.Random(f"{seed}:{task}:queries:{'t2' if task == 't2' else setting.replace('_icl', '')}")
    out, seen, budget = [], set(), 4 * n_test + 100
    for _ in range(budget):
        q = sample_query(query_rng)
        sentence = realize(q)
        if sentence in seen:
            continue
        targets, forbid = _targets(task, setting, q)
        if not targets <= index.keys():
            continue
        chosen = _select(masks, inputs, order, sentence, mask(targets), mask(forbid), k, select_rng)
        if chosen is None:
            continue
        seen.add(sentence)
        demos = [pool[i] for i in chosen]
        out.append({"prompt": format_prompt(demos, sentence), "input": sentence, "output": translate(q),
                    "primitives": primitives(q), "task": task, "setting": setting})
        if len(out) == n_test:
            return out
    raise ValueError(f"k={k}: only {len(out)} of {budget} sampled {task}/{setting} queries could have all their "
                     f"primitives covered by k demonstrations from a pool of {pool_size} (n_test={n_test} needed); "
                     "increase k or pool_size")


def as_dataset(task: str, setting: str, **kwargs) -> Dataset:
    """The prompts as a `datasets.Dataset` with `prompt` and `completion` (" " + logical form), for
    training; keyword arguments as in `build_prompts`."""
    from datasets import Dataset

    rows = build_prompts(task, setting, **kwargs)
    return Dataset.from_dict({"prompt": [r["prompt"] for r in rows], "completion": [" " + r["output"] for r in rows]})


# ---- metric ---------------------------------------------------------------------------------------

def _first_line(prediction: str) -> str:  # first non-blank line
    return prediction.strip().split("\n")[0].strip()


def wer(prediction: str, reference: str) -> float:
    """Word error rate of the prediction's first line against the reference (jiwer; 0 is perfect);
    an empty prediction is 1.0, every reference word deleted."""
    if not reference.strip():
        raise ValueError("reference is empty; WER divides by the number of reference words")
    hyp = _first_line(prediction)
    import jiwer  # the [eval] extra

    return 1.0 if not hyp else float(jiwer.wer(reference.strip(), hyp))


def exact_match(prediction: str, reference: str) -> float:
    """1.0 if the prediction's first line equals the reference (stripped), else 0.0."""
    return float(_first_line(prediction) == reference.strip())
