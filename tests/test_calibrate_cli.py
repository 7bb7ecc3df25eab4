"""`python -m calibrate sweep|fit`: bad input is one line naming the option, exit status 2, and
nothing is written."""
import pytest

from calibrate.__main__ import main


@pytest.mark.parametrize("argv, message", [
    (["fit", "--name", "../../x"], "argument --name: a calibration's name is a plain file name"),
    (["fit", "--name", "a/b"], "argument --name: a calibration's name is a plain file name"),
    (["sweep", "--block-size", "0"], "argument --block-size: must be at least 1, got 0"),
    (["sweep", "--seed", "-1"], "argument --seed: must be at least 0, got -1"),
    (["sweep", "--repeats", "0"], "argument --repeats: must be at least 1, got 0"),
    (["sweep", "--max-context", "8"], "argument --max-context: must be at least 16, got 8"),
])
def test_bad_options_are_named_before_any_work(tmp_path, capsys, argv, message):
    where = ["--results", str(tmp_path)] if argv[0] == "fit" else ["--device", "cpu", "--out", str(tmp_path / "out")]
    assert main(argv + where) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())


def test_a_sweep_into_a_file_is_refused_before_the_model_loads(tmp_path, capsys):
    pytest.importorskip("torch", reason="the sweep needs the engine extra (torch)")
    (tmp_path / "file").write_text("")
    assert main(["sweep", "--device", "cpu", "--out", str(tmp_path / "file")]) == 2
    assert f"--out {tmp_path / 'file'}: exists and is not a directory" in capsys.readouterr().err
