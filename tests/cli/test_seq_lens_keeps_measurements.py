"""``tuner profile --seq-lens`` keeps what it measured when its guesses are right: the
command of the report (a GPT whose later lengths each need only ``M*`` and ``M* + 1``)
exits 0, stores every length (here in an SQLite file, as ``TUNER_URL=sqlite:///…``
does), says why it took a probe more, and the ``tuner recommend … --seq-len N`` line it
prints then answers every length of the range it names, and refuses those past it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.client import TunerClient

COMMAND = ["profile", "examples.gpt:workload", "--seq-lens", "16,32,64", "--device", "cpu",
           "--memory-limit", "128MiB", "--headroom", "0"]  # fmt: skip
PRINTED = re.compile(
    r"tuner recommend (--workload \S+ --device \S+) --global-batch-size B --seq-len N "
    r"\(estimated from (\d+) to (\d+),"
)


@pytest.mark.slow
def test_the_reported_command_keeps_every_length_and_its_recommend_line_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    monkeypatch.setenv("TUNER_URL", url)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "400")  # the printed command on one line

    assert main([*COMMAND, "--upload"]) == 0
    captured = capsys.readouterr()
    # The later lengths' guesses were right: one of them took a probe for the fit, and said so.
    assert "one more probe, at" in captured.err
    assert "cannot separate" not in captured.err
    with TunerClient(url, cache_dir=tmp_path / "cache") as client:
        kept = [client.get_profile(s.id) for s in client.list_profiles().data]
    assert sorted(p.workload.seq_len or 0 for p in kept) == [16, 32, 64]
    assert all(p.max_micro_batch_size >= 1 for p in kept)

    printed = PRINTED.search(captured.out)
    assert printed is not None, captured.out
    names, lowest, highest = printed[1].split(), int(printed[2]), int(printed[3])
    assert (lowest, highest) == (8, 80)
    for seq_len in (lowest, 24, 48, highest):
        status = main(["recommend", *names, "--global-batch-size", "64", "--seq-len", str(seq_len)])
        out = capsys.readouterr()
        assert status == 0, out.err
        assert f"seq_len {seq_len}" in out.out
    # Past the range: the range refusal, not a fit that cannot be made.
    status = main(["recommend", *names, "--global-batch-size", "64", "--seq-len", "200"])
    err = capsys.readouterr().err
    assert status == 2
    assert "seq_len 200 is too far from the measured lengths (16, 32, 64)" in err
    assert "cannot separate" not in err
