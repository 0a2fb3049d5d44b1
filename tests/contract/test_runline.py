"""Which run lines a standby can stand in for (contract.runline): one python command, exactly
as bash would run it; every refusal names what bash would have done otherwise."""

from __future__ import annotations

import re

import pytest

from contract.runline import NotStandby, RunLine, parse


@pytest.mark.parametrize(("run", "parsed"), [
    ("exec python -m trainer --set a=1", RunLine("trainer", None, ("--set", "a=1"))),
    ("python3 train.py x", RunLine(None, "train.py", ("x",))),
    ("python -m pkg.mod 'a $b' \"c d\"", RunLine("pkg.mod", None, ("a $b", "c d"))),
    ("exec python -m trainer --config tiny --steps 1000000 --set checkpoint_every=100",
     RunLine("trainer", None, ("--config", "tiny", "--steps", "1000000", "--set",
                               "checkpoint_every=100"))),
])  # fmt: skip
def test_one_python_command_qualifies(run, parsed):
    assert parse(run) == parsed


@pytest.mark.parametrize(("run", "why"), [
    ("python -m x; rm -rf y", "';'"),
    ("python x.py && echo done", "'&'"),
    ("python -m x $HOME", "'$'"),
    ('python -m x "$HOME"', "'$'"),  # double quotes still expand
    ("python -m x `date`", "'`'"),
    ("python x.py *.txt", "'*'"),
    ("python x.py > out.log", "'>'"),
    ("python x.py ~/data", "'~'"),
    ("FOO=1 python x.py", "starts with 'FOO=1'"),
    ("uv run train.py", "starts with 'uv'"),
    ("bash run.sh", "starts with 'bash'"),
    ("python -u -m x", "option '-u'"),
    ("python -c 'print(1)'", "option '-c'"),
    ("python -", "option '-'"),
    ("python -m", "not followed by a module"),
    ("python -m 'a b'", "not followed by a module"),
    ("python notes.txt", "not a .py script"),
    ("python", "names no module or script"),
    ("python x.py 'unclosed", "does not parse"),
    ("", "starts with 'nothing'"),
])  # fmt: skip
def test_what_a_shell_or_an_option_would_change_runs_cold(run, why):
    with pytest.raises(NotStandby, match=re.escape(why)):
        parse(run)


def test_argv_is_what_the_interpreter_sets():
    assert parse("python -m trainer --x 1").argv == ["-m", "--x", "1"]
    assert parse("python t.py a").argv == ["t.py", "a"]


def test_the_standby_key_is_checked_where_the_operator_is():
    """`standby:` in tpupod-job.yaml: module names and a module:function hook; never with
    secrets, never for a run line a standby cannot run as bash would (one line naming why)."""
    from contract.job import JobError
    from contract.job import parse as parse_job

    ok = parse_job("run: exec python -m trainer --config tiny\nstandby:\n"
                   "  preload: [jax, jax.numpy, flax.linen]\n"
                   "  prepare: trainer.allocator:preload_env\n", "job.yaml")  # fmt: skip
    assert ok.standby.preload == ("jax", "jax.numpy", "flax.linen")
    assert ok.standby.prepare == "trainer.allocator:preload_env"
    assert parse_job("run: python train.py\n", "job.yaml").standby is None  # no key: none
    refusals = {
        "run: python -m t\nstandby: {preload: ['jax numpy']}\n": "is not a module name",
        "run: python -m t\nstandby: {prepare: trainer.allocator}\n": "is not module:function",
        "run: python -m t\nstandby: {preload: [jax], speed: 1}\n": "standby.speed",
        "run: python -m t\nsecrets: [TOKEN]\nstandby: {preload: [jax]}\n": "job with secrets",
        "run: uv run train.py\nstandby: {preload: [jax]}\n": "starts with 'uv'",
        "run: python -m t > log\nstandby: {preload: [jax]}\n": "needs a shell for '>'",
    }
    for text, why in refusals.items():
        with pytest.raises(JobError, match=re.escape(why)) as err:
            parse_job(text, "job.yaml")
        assert str(err.value).startswith("job.yaml: ") and "\n" not in str(err.value)
