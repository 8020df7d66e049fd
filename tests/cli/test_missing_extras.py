"""A command whose extra is not installed says in one line which one, and exits 2.

Every extra is installed here, so each test runs the real ``tuner`` console script in a
child process whose ``sitecustomize`` makes the extra's modules unimportable
(``sys.modules[name] = None``): exactly what an install without the extra looks like to
the import system. ``tests/test_packaging.py`` checks the same for torch in a real venv
that has only the ``server`` extra.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, subprocess_env, tuner_executable
from tuner.core.extras import EXTRA_MODULES, MissingExtraError, install_line, require

SERVER = EXTRA_MODULES["server"]


def run_without(
    modules: tuple[str, ...], *args: str, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """Run ``tuner ARGS`` in a child process where ``modules`` cannot be imported."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        f"import sys\nfor name in {list(modules)!r}:\n    sys.modules[name] = None\n"
    )
    env = subprocess_env()
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    # Whatever goes wrong, never the user's own store.
    env["TUNER_DATABASE_URL"] = f"sqlite:///{tmp_path / 'tuner.db'}"
    return subprocess.run(
        [str(tuner_executable()), *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_one_line_naming(result: subprocess.CompletedProcess[str], extra: str) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert install_line(extra) in lines[0]
    assert f"the {extra} extra" in lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "args",
    [
        ("serve",),
        ("serve", "--port", "8765", "--public-reads"),
        ("token", "create", "--name", "ci", "--scope", "read"),
        ("token", "list"),
        ("db", "upgrade"),
    ],
    ids=["serve", "serve-options", "token-create", "token-list", "db-upgrade"],
)
def test_service_commands_without_the_server_extra(args: tuple[str, ...], tmp_path: Path) -> None:
    line = assert_one_line_naming(run_without(SERVER, *args, tmp_path=tmp_path), "server")
    assert line.startswith(f"tuner {args[0]} needs the server extra (fastapi, uvicorn")
    assert not (tmp_path / "tuner.db").exists()


def test_a_missing_module_is_named_even_when_the_rest_is_there(tmp_path: Path) -> None:
    line = assert_one_line_naming(run_without(("alembic",), "serve", tmp_path=tmp_path), "server")
    assert "(alembic not installed)" in line


def test_profile_without_torch(tmp_path: Path) -> None:
    result = run_without(
        ("torch",), "profile", "examples.gpt:workload", "--device", "cpu", tmp_path=tmp_path
    )
    line = assert_one_line_naming(result, "torch")
    assert line == (
        "tuner profile needs the torch extra (torch not installed): "
        "pip install -e '.[torch]' in your clone of microbatch-tuner"
    )


@pytest.mark.slow
def test_hugging_face_workloads_without_transformers(tmp_path: Path) -> None:
    result = run_without(
        ("transformers",),
        "profile",
        "tuner.hf:causal_lm",
        "-o",
        "config=tests/data/tiny_llama.json",
        "--device",
        "cpu",
        "--memory-limit",
        "64MiB",
        tmp_path=tmp_path,
    )
    line = assert_one_line_naming(result, "hf")
    assert line.startswith("tuner.hf needs the hf extra (transformers not installed)")


def test_help_needs_no_extra(tmp_path: Path) -> None:
    everything = tuple(name for modules in EXTRA_MODULES.values() for name in modules)
    for command in ("serve", "token", "db", "profile"):
        result = run_without(everything, command, "--help", tmp_path=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "usage: tuner" in result.stdout


def test_require_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    require("server", feature="the service")  # installed here: nothing raised
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    with pytest.raises(MissingExtraError, match=r"^the service needs the server extra \("):
        require("server", feature="the service")
    with pytest.raises(ValueError, match="no extra named 'gpu'"):
        install_line("gpu")


def test_lora_without_peft(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.hf import causal_lm

    monkeypatch.setitem(sys.modules, "peft", None)
    config = str(REPO_ROOT / "tests" / "data" / "tiny_llama.json")
    with pytest.raises(MissingExtraError, match=r"^lora needs the hf extra \(peft not installed\)"):
        causal_lm(config=config, seq_len=16, lora=4)
