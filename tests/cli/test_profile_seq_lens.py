"""``tuner profile --seq-lens``: one command profiles a workload at several sequence
lengths, stores a profile per length linked as a family (here in an SQLite file, as
``TUNER_URL=sqlite:///…`` does), and prints the lengths, the fit and the family."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from examples.gpt import workload as gpt_workload
from tuner.cli import main
from tuner.client import TunerClient
from tuner.engine.workload import Workload

GPT = ["examples.gpt:workload", "-o", "vocab=64", "-o", "dim=16", "-o", "layers=1",
       "-o", "heads=2"]  # fmt: skip
PROFILE = ["profile", *GPT, "--device", "cpu", "--memory-limit", "1MiB"]
LENGTHS = "64,16,32"


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """The command as a user runs it, uploading to an SQLite file, with --json."""
    database = tmp_path_factory.mktemp("seq_lens") / "tuner.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TUNER_URL", f"sqlite:///{database}")
        patch.setenv("TUNER_CACHE_DIR", str(database.parent / "cache"))
        capture = _Capture()
        with capture:
            status = main(
                [*PROFILE, "--seq-lens", LENGTHS, "--global-batch-size", "32", "--json", "--upload"]
            )
    assert status == 0, capture.err
    document: dict[str, Any] = json.loads(capture.out)
    return document, database


class _Capture:
    """stdout and stderr of an in-process run inside a module-scoped fixture (capsys is
    per test)."""

    def __enter__(self) -> None:
        self._out, self._err = io.StringIO(), io.StringIO()
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(contextlib.redirect_stdout(self._out))
        self._stack.enter_context(contextlib.redirect_stderr(self._err))

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self.out, self.err = self._out.getvalue(), self._err.getvalue()


@pytest.mark.slow
def test_one_profile_per_length_is_stored_as_one_family(
    stored: tuple[dict[str, Any], Path],
) -> None:
    document, database = stored
    assert document["seq_lens"] == [16, 32, 64]
    family = document["length_family"]
    assert family
    ids = [p["profile_id"] for p in document["profiles"]]
    assert len(set(ids)) == 3
    with TunerClient(f"sqlite:///{database}", cache_dir=database.parent / "cache") as client:
        kept = [client.get_profile(i) for i in ids]
    assert [p.workload.seq_len for p in kept] == [16, 32, 64]
    assert {p.workload.length_family for p in kept} == {family}
    assert len({p.workload_key for p in kept}) == 3
    assert [p.max_micro_batch_size for p in kept] == [
        p["max_micro_batch_size"] for p in document["profiles"]
    ]


@pytest.mark.slow
def test_each_length_gets_bisections_answer_in_few_probes(
    stored: tuple[dict[str, Any], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The first length is aimed by the dry run (M* and M* + 1), later ones by the lengths
    before them and the dry run; one more probe where the fit across lengths needs it."""
    profiles = stored[0]["profiles"]
    probes = [len(p["probes"]) for p in profiles]
    assert probes[0] == 2, probes
    assert all(count <= 3 for count in probes), probes
    for profile in profiles:
        seq_len = profile["seq_len"]
        found = profile["max_micro_batch_size"]
        assert profile["tokens_per_micro_batch"] == found * seq_len
        assert sum(size * count for size, count in profile["recommendation"]["split"]) == 32
        status = main(
            [*PROFILE, "-o", f"seq_len={seq_len}", "--strategy", "bisect", "--no-explore", "--json"]
        )
        assert status == 0
        bisected = json.loads(capsys.readouterr().out)
        assert bisected["max_micro_batch_size"] == found
        assert bisected["workload"]["seq_len"] == seq_len
        assert bisected["workload"]["length_family"] is None


def test_the_fit_is_in_the_json(stored: tuple[dict[str, Any], Path]) -> None:
    fit = stored[0]["fit"]
    assert fit["seq_lens"] == [16, 32, 64]
    assert fit["per_token_bytes"] > 0
    assert 0 <= fit["max_relative_error"] < 0.05


@pytest.mark.slow
def test_the_table_the_fit_the_family_and_how_to_ask_for_another_length(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main([*PROFILE, "--seq-lens", "16,32"])
    assert status == 0
    out = capsys.readouterr().out
    assert "Sequence lengths (measured)" in out
    for column in ("seq_len", "M*", "tokens", "probes", "peak"):
        assert column in out
    assert "fit       peak(m, s) ≈ a0 + a1·s + b·m·s + c·m·s²" in out
    assert "family    " in out
    assert "tuner recommend --workload" in out
    assert "--seq-len N (estimated from 8 to 40" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--seq-lens", "16,x"], "'x' is not a whole number"),
        (["--seq-lens", "16"], "two or more different sequence lengths"),
        (["--seq-lens", "16,16"], "two or more different sequence lengths"),
        (["--seq-lens", "16,-8"], "-8 is not a positive whole number"),
        (["--seq-lens", "16,32", "-o", "seq_len=8"], "leave out -o seq_len="),
        (["--seq-lens", "16,32", "--explore"], "leave out --explore"),
        (["--seq-lens", "16,32", "--parallel", "ddp"], "leave out --parallel"),
        (["--seq-lens", "16,32", "-o", "parallel=ddp"], "profile each length on its own"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        status = main([*PROFILE, *extra])
    except SystemExit as exc:  # argparse refuses a length that is not a number
        status = int(exc.code or 0)
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert "\n" not in err


def test_a_factory_without_seq_len_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    command = ["profile", "examples.mlp:workload", "--device", "cpu", "--memory-limit", "1MiB"]
    assert main([*command, "--seq-lens", "16,32"]) == 2
    assert "takes no seq_len option" in capsys.readouterr().err


def test_nothing_fitting_at_any_length_exits_3_with_advice(
    capsys: pytest.CaptureFixture[str],
) -> None:
    command = ["profile", *GPT, "--device", "cpu", "--memory-limit", "10KB"]
    assert main([*command, "--seq-lens", "16,32"]) == 3
    captured = capsys.readouterr()
    assert "fit       none: it needs two or more lengths" in captured.out
    assert "Even a micro batch of 1 does not fit" in captured.err


def failing_at_long_lengths(seq_len: int) -> Workload:
    """The small GPT, whose loss raises a plain error from seq_len 32 on."""
    built = gpt_workload(vocab=64, dim=16, layers=1, heads=2, seq_len=seq_len)
    if seq_len >= 32:

        def loss_fn(model: Any, batch: Any) -> Any:
            raise RuntimeError("the loss broke at this length")

        built.loss_fn = loss_fn
    return built


@pytest.mark.slow
def test_a_workload_error_at_a_later_length_exits_1_with_its_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = "tests.cli.test_profile_seq_lens:failing_at_long_lengths"
    command = ["profile", target, "--device", "cpu", "--memory-limit", "1MiB"]
    assert main([*command, "--seq-lens", "16,32"]) == 1
    err = capsys.readouterr().err
    assert "the loss broke at this length" in err
    assert "not an out-of-memory; fix the workload" in err
