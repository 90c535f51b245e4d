"""--preset pair without the pair installed: one line saying how to install it, exit status 1."""
import pytest

import bench
import infer


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))


def test_repl_says_how_to_install_the_pair(empty_cache, capsys):
    with pytest.raises(SystemExit) as exited:
        infer.main(["--preset", "pair", "--prompt", "hi"])
    out = capsys.readouterr().out
    assert exited.value.code == 1
    lines = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "not installed" in lines[0] and "make fetch-pair" in lines[0]


def test_bench_says_how_to_install_the_pair(empty_cache):
    with pytest.raises(SystemExit) as exited:
        bench.main(["--preset", "pair", "--limit", "1"])
    assert "not installed" in str(exited.value.code) and "make fetch-pair" in str(exited.value.code)
