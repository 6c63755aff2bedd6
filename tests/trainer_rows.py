"""What the trainer tests share (tests/talr, tests/muscle, tests/utils/test_sharded.py and the scripts they launch):
the rows they train on, MUSCLE's config on the CPU (TALR's is conftest's `cpu_args`) and the check that two runs'
updates agree."""

import torch

ROWS = [
    {"prompt": "the opposite of hot is", "completion": " cold ."},
    {"prompt": "question : opposite of big ? answer :", "completion": " small ."},
    {"prompt": "count : 4 5 6", "completion": " 7 8 9 ."},
    {"prompt": "question : opposite of up ? answer :", "completion": " down ."},
    {"prompt": "count : 11 12", "completion": " 13 14 15 16 ."},
    {"prompt": "the opposite of wet is", "completion": " dry ."},
    {"prompt": "question : opposite of fast ? answer :", "completion": " slow ."},
    {"prompt": "count : 30 31 32", "completion": " 33 34 ."},
]


def compat_args(out, new_adapter, **kw):
    from adaptguard import MUSCLEConfig

    base = dict(output_dir=str(out), bf16=False, gradient_checkpointing=False, use_cpu=True, report_to="none",
                save_strategy="no", logging_steps=1, per_device_train_batch_size=8, disable_tqdm=True, seed=0,
                new_adapter=None if new_adapter is None else str(new_adapter))
    base.update(kw)
    return MUSCLEConfig(**base)


def assert_updates_agree(a, b, init):
    """The two runs' updates of every tensor agree to 1e-3 relative, up to the rounding of the stored weights: each
    run rounds w + δ to float32, and another summation order (ISA, threads, processes) can round it to the
    neighbouring float, 1 ulp(w) ≤ eps·|w| away in either run."""
    for n in a:
        delta_a, delta_b = a[n] - init[n], b[n] - init[n]
        room = 1e-3 * delta_b.abs() + 2 * torch.finfo(torch.float32).eps * init[n].abs() + 1e-12
        worst = ((delta_a - delta_b).abs() / room).max().item()
        assert worst <= 1, f"{n}: the updates differ by {worst:.2f}x the tolerance"
