"""The exact MUSCLE loss on a real model (issue 74): SmolLM2-135M (`built:smollm2`: vocabulary 49,152, hidden 576,
tied embeddings) as v2's base, v1 a copy with noise on its matrices, the student v2 + a LoRA moved off its start.
Value and gradient of `exact_token_loss`, as the trainer calls it, against float64 from the full logits, for every
built-in mask, T ∈ {0.5, 1, 2, 4}, with and without the cross-entropy term, and each way a teacher arrives: both as
vectors from the live teachers (the trainer's default), v1 from an exact cache (`cache-logits --kind vectors`) in
float32 and in its default bfloat16, both in logit space (`online=`). Then the trainer's own loss and LoRA gradients
at T = 1 (the issue's set-up), and the kernel path with cut-cross-entropy's torch reference at T = 1.

Tolerances (u = 2⁻²⁴, float32's unit roundoff):
- the loss, per scored token t: |Δ| ≤ 8·u·S_t·(a_t/T + λ_CE), with a_t the token's teacher weights and S_t =
  max_v Σ_d |h_td W_vd| (≈ 190 here: u·S ≈ 1.1e-5), the rounding scale of one float32 logit (measured: 2–4 u·S). The
  exact loss is a difference of terms of the logits' size, LSE(z/T) − h·m/T, each from a float32 product over the
  hidden size; a dense KL, Σ q (log q − log p), is not (within 6e-6 per token here).
- the gradient in h, over the batch: ‖Δ‖ ≤ 4 × the error of the same gradient computed densely in float32 (the logits
  from a float32 product, Wᵀ(p − q)/T), i.e. what float32 earns on this CPU (measured: about 1 ×).
- a bfloat16 cache rounds each m_d, |δm_d| ≤ 2⁻⁸|m_d|, which adds a_old·2⁻⁸·Σ_d |h_td m_td|/T to the loss's bound
  and a_old·2⁻⁸·‖m_t‖/T per token (in quadrature) to the gradient's: rigorous bounds. The error it costs, measured,
  is in docs/muscle.md.
Before issue 74's fix the loss at T = 1 was off by up to 1e-3 per token (≈ 90 u·S), its gradient by 8 × float32's
error.
"""

from types import SimpleNamespace

import pytest
import torch
from conftest import built_smollm2_or_skip

pytestmark = pytest.mark.real

U = 2.0 ** -24  # float32's unit roundoff
U_BF16 = 2.0 ** -8  # bfloat16's (8 significant bits)
TEMPERATURES = (0.5, 1.0, 2.0, 4.0)
# one batch: 12 scored tokens (multi-digit answers, words, end-of-turn), peaked and flat next-token distributions
ROWS = [{"prompt": f"Q: What is {a} plus {b}?\nA:", "completion": f" {a + b}"} for a, b in ((7, 5), (9, 6))] + \
       [{"prompt": f"Q: What is the opposite of {a}?\nA:", "completion": f" {b}"} for a, b in (("hot", "cold"), ("up", "down"))]


@pytest.fixture(scope="module")
def smollm2_path():
    return built_smollm2_or_skip()


@pytest.fixture(scope="module")
def run(smollm2_path, tmp_path_factory):
    """The trainer (LoRA r 8 on all linear layers, its B moved by 0.05·N(0, 1); the new teacher = the base), v1 (the
    base + 0.02·std(W)·N(0, 1) on every matrix but the embeddings), the first batch, the three models' last hidden
    states at its scored tokens, and their float64 logits."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard import MUSCLEConfig, MUSCLETrainer
    from adaptguard.muscle.heads import last_hidden_state, output_head
    from adaptguard.trl_adapter import no_activation_checkpointing
    from adaptguard.utils.labels import shifted_labels

    tmp = tmp_path_factory.mktemp("exact_real")
    g = torch.Generator().manual_seed(0)
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    old = AutoModelForCausalLM.from_pretrained(smollm2_path).eval()
    with torch.no_grad():
        for name, p in old.named_parameters():
            if p.ndim == 2 and "embed" not in name:
                p.add_(0.02 * p.std() * torch.randn(p.shape, generator=g))
    args = MUSCLEConfig(output_dir=str(tmp / "run"), bf16=False, use_cpu=True, report_to="none", save_strategy="no",
                        per_device_train_batch_size=4, max_length=32, temperature=1.0, mask="student_wrong",
                        ce_weight=0.0, disable_tqdm=True, seed=0, **no_activation_checkpointing())
    trainer = MUSCLETrainer(model=str(smollm2_path), args=args, old_model=old, old_processing_class=tok,
                            processing_class=tok, train_dataset=Dataset.from_list(ROWS),
                            peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                   task_type="CAUSAL_LM"))
    assert trainer._exact and trainer.new_teacher == "base"
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    batch = next(iter(trainer.get_train_dataloader()))
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    shifted = shifted_labels(batch["labels"])
    scored = (shifted.reshape(-1) != -100).nonzero()[:, 0]
    at_scored = lambda h: h.reshape(-1, h.shape[-1])[scored]  # noqa: E731
    model = trainer.model.eval()
    with torch.no_grad():
        hs = at_scored(last_hidden_state(model, inputs))
        hn, new_head = trainer._live_new_teacher(model, inputs)
        ho = at_scored(last_hidden_state(old, inputs))
    hn, head, old_head = at_scored(hn), output_head(model), output_head(old)
    w64 = head.weight.detach().double()
    return SimpleNamespace(trainer=trainer, old=old, tok=tok, batch=batch, inputs=inputs, shifted=shifted,
                           scored=scored, y=shifted.reshape(-1)[scored], head=head, old_head=old_head,
                           new_head=new_head, hs=hs, ho=ho, hn=hn, w64=w64, zs=hs.double() @ w64.T,
                           zo=ho.double() @ old_head.weight.double().T, zn=hn.double() @ w64.T,
                           s=(hs.double().abs() @ w64.abs().T).amax(-1), tmp=tmp, refs={}, caches={})


def reference(run, temperature):
    """Per token, float64 from the full logits: the two KLs and the cross-entropy, and their gradients in h. And the
    gradients computed densely in float32 (the logits from a float32 product), what float32 earns on this CPU: with
    the distributions normalised by a cascade sum, and with the student's from `torch.log_softmax` (whose CPU kernel
    drops the sub-ulp tail of the vocabulary: issue 74), which cut-cross-entropy's torch reference calls."""
    if temperature not in run.refs:
        w32, y = run.head.weight.detach(), run.y
        onehot = torch.zeros_like(run.zs).scatter_(1, y[:, None], 1.0)
        cascade = lambda z: z - torch.logsumexp(z, -1, keepdim=True)  # noqa: E731
        kernel = lambda z: torch.log_softmax(z, -1)  # noqa: E731

        def dense(zs, zo, zn, w, student_log_softmax, log_softmax):
            log_p = student_log_softmax(zs / temperature)
            parts = {}
            for name, z in (("old", zo), ("new", zn)):
                log_q = log_softmax(z / temperature)
                parts[name] = ((log_q.exp() * (log_q - log_p)).sum(-1), (log_p.exp() - log_q.exp()) @ w / temperature)
            log_p1 = student_log_softmax(zs)
            parts["ce"] = (-log_p1.gather(1, y[:, None])[:, 0], (log_p1.exp() - onehot.to(zs.dtype)) @ w)
            return parts

        zs32, zo32, zn32 = run.hs @ w32.T, run.ho @ run.old_head.weight.T, run.hn @ w32.T
        run.refs[temperature] = {"float64": dense(run.zs, run.zo, run.zn, run.w64, kernel, kernel),
                                 "float32": dense(zs32, zo32, zn32, w32, cascade, cascade),
                                 "float32, torch.log_softmax": dense(zs32, zo32, zn32, w32, kernel, cascade)}
    return run.refs[temperature]


def mix(parts, weights, ce_weight, i):
    """Σ_j a_j KL_j + λ_CE·CE per token (i = 0) or its gradient (i = 1) from `reference`'s parts; weights (K, N, 2)."""
    a_old, a_new = weights.to(parts["old"][i].dtype).unbind(-1)
    if i == 1:
        a_old, a_new = a_old[..., None], a_new[..., None]
    return a_old * parts["old"][i] + a_new * parts["new"][i] + ce_weight * parts["ce"][i]


def reference_weights(run, mask):
    """(N, 2) teacher weights (old, new) of MUSCLE's mask, decided on the float64 logits."""
    from adaptguard.muscle.losses import MaskInputs, apply_mask

    labels = run.shifted

    def grid(values):
        out = torch.zeros(labels.numel(), dtype=values.dtype)
        out[run.scored] = values
        return out.view(labels.shape)

    def label_logp(z):
        return torch.log_softmax(z, -1).gather(1, run.y[:, None])[:, 0]

    inputs = MaskInputs(labels=labels, valid=labels != -100, student_top1=grid(run.zs.argmax(-1)),
                        old_top1=grid(run.zo.argmax(-1)), new_top1=grid(run.zn.argmax(-1)),
                        student_label_logp=grid(label_logp(run.zs)), old_label_logp=grid(label_logp(run.zo)),
                        new_label_logp=grid(label_logp(run.zn)))
    m = apply_mask(mask, inputs).reshape(-1)[run.scored].double()
    return torch.stack([m, 1 - m], 1)


def old_cache(run, temperature, dtype):
    """v1's exact cache at `temperature`, written as `adaptguard cache-logits --kind vectors` writes it
    (`build_vector_cache`, on the rows the trainer trains on) and read as the trainer reads it: rows found by
    fingerprint, checked against the student's output layer and the temperature."""
    from adaptguard.muscle.logit_cache import LogitCache, build_vector_cache, row_fingerprint

    key = (temperature, dtype)
    if key not in run.caches:
        trainer = run.trainer
        out = build_vector_cache(run.old, run.tok, trainer.train_dataset, trainer.data_collator,
                                 run.tmp / f"cache-{temperature}-{dtype}", run.head, temperature=temperature,
                                 dtype=getattr(torch, dtype))
        cache = LogitCache(out)
        cache.check_vectors(run.head, temperature)
        mask, labels = run.inputs["attention_mask"].bool(), run.batch["labels"]
        prints = [row_fingerprint(i[m], lab[m]) for i, m, lab in zip(run.inputs["input_ids"], mask, labels)]
        run.caches[key] = cache.vectors_batch(cache.rows_for(prints), labels)
    return run.caches[key]


def teachers(run, placement, temperature):
    """(v1's and v2's vectors, exact_token_loss's teacher arguments) for a placement of the teachers."""
    from adaptguard.muscle.exact import stack, teacher_vectors

    new = teacher_vectors(run.hn, run.new_head, run.head, run.y, temperature)
    old = teacher_vectors(run.ho, run.old_head, run.head, run.y, temperature)
    if placement == "logit space":
        return old, new, {"online": ((run.ho, run.old_head), (run.hn, run.new_head))}
    if placement.startswith("v1 cache"):
        old = old_cache(run, temperature, placement.rpartition(" ")[2])
    return old, new, {"cached": stack([old, new])}


def every_mask_at_once(run, old, new, masks):
    """The masks' weight functions on K copies of the batch's N tokens, copy k read by mask k: one pass of the loss
    computes all K (each token's loss and gradient are its own), one vocabulary product for K·N tokens."""
    from adaptguard.muscle.exact import StudentChunk, mask_weights

    n = len(run.y)
    each = [mask_weights(mask, run.shifted, run.scored, old, new, torch.ones(n)) for mask in masks]

    def weights(rows, student):
        out = torch.empty(len(rows), 2)
        for k, fn in enumerate(each):
            mine = rows // n == k
            if mine.any():
                mine_of = None if student is None else StudentChunk(student.top1[mine], student.label_logp[mine])
                out[mine] = fn(rows[mine] - k * n, mine_of).float()
        return out

    weights.reads_student = any(fn.reads_student for fn in each)
    return weights


def value_bound(run, temperature, weights, ce_weight, bf16_m=None):
    """Per-token tolerance of the loss (module docstring); weights (..., N, 2); `bf16_m`: a bfloat16 cache's m (N, H)."""
    bound = 8 * U * run.s * (weights.sum(-1) / temperature + ce_weight)
    if bf16_m is not None:
        bound = bound + weights[..., 0] * U_BF16 * (run.hs.double().abs() * bf16_m.double().abs()).sum(-1) / temperature
    return bound


def check(case, run, temperature, ce_weight, weights, loss, grad, fp32, bf16_m=None) -> str:
    """Assert a loss (K, N) and its gradient (K, N, H) within the module docstring's tolerances of float64."""
    ref = reference(run, temperature)["float64"]
    err = (loss.double() - mix(ref, weights, ce_weight, 0)).abs()
    tol = value_bound(run, temperature, weights, ce_weight, bf16_m)
    assert (err <= tol).all(), f"{case}: |Δloss_t| {err.max():.2e} over its bound {tol.flatten()[err.argmax()]:.2e}"
    want = mix(ref, weights, ce_weight, 1)
    for k, (got, want_k, weights_k) in enumerate(zip(grad.double(), want, weights)):
        grad_tol = 4 * (mix(fp32, weights_k, ce_weight, 1).double() - want_k).norm()
        if bf16_m is not None:  # per token ‖δm‖/T ≤ 2⁻⁸‖m‖/T, in quadrature over the tokens
            grad_tol = grad_tol + (weights_k[:, 0] * U_BF16 * bf16_m.double().norm(dim=-1) / temperature).norm()
        assert (got - want_k).norm() <= grad_tol, f"{case}, copy {k}: ‖Δ∂/∂h‖ {(got - want_k).norm():.2e} over {grad_tol:.2e}"
    return (f"{case}: loss Δ/token mean {(loss.double() - mix(ref, weights, ce_weight, 0)).mean():+.1e}, "
            f"max {err.max():.1e} ({(err / tol).max():.2f} of the bound)")


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("placement", ["both vectors", "v1 cache float32", "v1 cache bfloat16", "logit space"])
def test_exact_loss_is_the_float64_loss_on_smollm2(run, placement, temperature):
    from adaptguard.muscle.exact import exact_token_loss
    from adaptguard.muscle.masks import MASKS

    names = sorted(MASKS)
    old, new, teachers_ = teachers(run, placement, temperature)
    k, n = len(names), len(run.y)
    weights = every_mask_at_once(run, old, new, [MASKS[name] for name in names])
    want_w = torch.stack([reference_weights(run, MASKS[name]) for name in names])  # (K, N, 2)
    copies = {"cached": type(old)(*(torch.cat([f] * k) for f in teachers_["cached"]))} if "cached" in teachers_ else \
        {"online": tuple((torch.cat([h] * k), head) for h, head in teachers_["online"])}
    for ce_weight in (0.0, 0.5):
        case = f"{placement}, T {temperature}, λ_CE {ce_weight}"
        h = torch.cat([run.hs] * k).requires_grad_()
        ce = torch.full((k * n,), ce_weight) if ce_weight else None
        out = exact_token_loss(h, run.head, torch.cat([run.y] * k), weights, temperature=temperature, ce_weight=ce,
                               **copies)
        out.loss.sum().backward()
        for name, got, want in zip(names, out.weights.view(k, n, 2).double(), want_w):
            assert torch.equal(got, want), f"{case}: mask {name} decided otherwise than on the float64 logits"
        print(check(case, run, temperature, ce_weight, want_w, out.loss.view(k, n), h.grad.view(k, n, -1),
                    reference(run, temperature)["float32"], old.m if placement.endswith("bfloat16") else None))


def test_the_trainers_loss_and_lora_gradients_at_temperature_one(run):
    """Issue 74's set-up end to end: `MUSCLETrainer.compute_loss` (`loss_implementation="auto"`, i.e. the exact loss;
    `student_wrong`; T = 1; λ_CE = 0) on the first batch: its value, and the LoRA weights' gradients, against float64
    from the full logits, the student's through the same float32 backbone."""
    from adaptguard.muscle.heads import last_hidden_state
    from adaptguard.muscle.masks import MASKS

    trainer, model = run.trainer, run.trainer.model
    lora = [p for p in model.parameters() if p.requires_grad]
    a = reference_weights(run, MASKS["student_wrong"])

    def gradient(loss, **kwargs):
        model.zero_grad()
        loss.backward(**kwargs)
        return torch.cat([p.grad.reshape(-1) for p in lora]).double()

    def dense(h, dtype, log_softmax):  # the KL mix from the three models' full logits in `dtype`
        w = run.head.weight.detach().to(dtype)
        log_p = log_softmax(h.to(dtype) @ w.T)
        per_token = 0
        for j, (h_t, head) in enumerate(((run.ho, run.old_head), (run.hn, run.new_head))):
            log_q = log_softmax(h_t.to(dtype) @ head.weight.to(dtype).T)
            per_token = per_token + a[:, j].to(dtype) * (log_q.exp() * (log_q - log_p)).sum(-1)
        return per_token.mean()

    got_loss = trainer.compute_loss(model, dict(run.batch))
    got = gradient(got_loss)
    h = last_hidden_state(model, run.inputs).reshape(-1, run.hs.shape[1])[run.scored]
    want_loss = dense(h, torch.float64, lambda z: torch.log_softmax(z, -1))
    want = gradient(want_loss, retain_graph=True)
    fp32 = gradient(dense(h, torch.float32, lambda z: z - torch.logsumexp(z, -1, keepdim=True)))
    tol = value_bound(run, 1.0, a, 0.0).mean()
    assert abs(got_loss.item() - want_loss.item()) <= tol, f"loss {got_loss.item()} vs float64 {want_loss.item()}"
    assert (got - want).norm() <= 4 * (fp32 - want).norm(), \
        f"‖Δ∂‖/‖∂‖ {(got - want).norm() / want.norm():.2e}, float32 dense {(fp32 - want).norm() / want.norm():.2e}"


def test_cut_cross_entropy_torch_reference_at_temperature_one(run, monkeypatch):
    """The kernel path (`kernel_token_loss`: the student's LSE from cut-cross-entropy) with the kernel's torch
    reference, as on a machine without CUDA (run eagerly), at T = 1 for every mask that reads only the teachers. Its
    LSE is `F.cross_entropy`'s, so its gradient is held to the float32 yardstick with `torch.log_softmax` (on a CPU:
    8 × the cascade's at T = 1 here; docs/muscle.md)."""
    pytest.importorskip("cut_cross_entropy")
    import cut_cross_entropy.torch_compile as reference_impl

    from adaptguard.muscle.exact import kernel_token_loss
    from adaptguard.muscle.masks import MASKS

    monkeypatch.setattr(reference_impl, "torch_compile_linear_cross_entropy_apply",
                        reference_impl.torch_compile_linear_cross_entropy_apply.__wrapped__)
    names = sorted(set(MASKS) - {"student_wrong"})
    old, new, teachers_ = teachers(run, "both vectors", 1.0)
    k, n = len(names), len(run.y)
    weights = every_mask_at_once(run, old, new, [MASKS[name] for name in names])
    assert not weights.reads_student
    want_w = torch.stack([reference_weights(run, MASKS[name]) for name in names])
    cached = type(old)(*(torch.cat([f] * k) for f in teachers_["cached"]))
    for ce_weight in (0.0, 0.5):
        h = torch.cat([run.hs] * k).requires_grad_()
        ce = torch.full((k * n,), ce_weight) if ce_weight else None
        loss, _, _ = kernel_token_loss(h, run.head, torch.cat([run.y] * k), weights(torch.arange(k * n), None), cached,
                                       temperature=1.0, ce_weight=ce, impl="torch_compile")
        loss.sum().backward()
        print(check(f"cut-cross-entropy's torch reference, λ_CE {ce_weight}", run, 1.0, ce_weight, want_w,
                    loss.view(k, n), h.grad.view(k, n, -1), reference(run, 1.0)["float32, torch.log_softmax"]))
