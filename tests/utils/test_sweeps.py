import pytest


def test_spread_and_its_format():
    from adaptguard.utils.sweeps import format_spread, spread

    s = spread([0.5, 0.25, 1.0])
    assert s == {"mean": pytest.approx(1.75 / 3), "min": 0.25, "max": 1.0, "n": 3}
    assert format_spread(s, ".2f", 100) == "58.33 (25.00–100.00)"
    assert format_spread(spread([0.125])) == "0.125"  # one seed: no range to show
    with pytest.raises(ValueError, match="at least one value"):
        spread([])


@pytest.mark.parametrize("bad", [0, -3, True, 2.0, "5"])
def test_seed_list_rejects_what_is_not_a_positive_integer(bad):
    from adaptguard.utils.sweeps import seed_list

    with pytest.raises(ValueError, match="--seeds: expected a positive integer"):
        seed_list(bad)


def test_seed_list_and_machine_info():
    import torch

    from adaptguard.utils.sweeps import machine_info, machine_line, seed_list

    assert seed_list(3) == [0, 1, 2]
    info = machine_info()
    assert info["torch"] == torch.__version__ and info["threads"] == torch.get_num_threads()
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert info["cpu"] and info["cpu"] in machine_line(info)
    assert machine_line({**info, "threads": 1}).endswith("kernels, 1 thread).")


@pytest.mark.parametrize("command", [["demo"], ["drift", "experiment"], ["update", "--preset", "tiny"]])
def test_cli_bad_seeds_exit_2_and_write_nothing(tmp_path, command):
    from in_process import run_cli

    out = tmp_path / "out"
    proc = run_cli(*command, "--seeds", "0", "--out", out)
    assert proc.returncode == 2 and "--seeds: expected a positive integer, got 0" in proc.stderr
    assert "writing" not in proc.stdout and not out.exists()


def test_command_line_parses_back_to_the_same_arguments():
    """The command a report prints reruns the experiment as it ran: HfArgumentParser reads it back unchanged."""
    import shlex
    from dataclasses import dataclass, field

    from transformers import HfArgumentParser

    from adaptguard.utils.sweeps import command_line

    @dataclass
    class Args:
        model: str = field(default="built:smollm2")
        limit: int = field(default=100)
        variants: str = field(default="int8")
        quick: bool = field(default=False)

    args = Args(model="my org/model", limit=7, quick=True)  # a space, to check the quoting
    command = command_line("examples/x.py", args)
    assert command == "python examples/x.py --model 'my org/model' --limit 7 --quick"
    (parsed,) = HfArgumentParser(Args).parse_args_into_dataclasses(shlex.split(command)[2:])
    assert parsed == args
    assert command_line("examples/x.py", Args()) == "python examples/x.py"
