"""The build's phase spinner: shown on a terminal, updated by the phase, silent in pipes and under --json."""

from infc.compiler.build_phases import phase


def test_a_phase_shows_on_a_terminal_and_renames(monkeypatch, capsys):
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich treats stderr as a terminal
    with phase("sample run at the profile's opt shapes", True):
        pass
    assert "sample run at the profile's opt shapes" in capsys.readouterr().err
    with phase("optimizing the graph", True) as update:
        update("optimizing: fuse / fuse_bias_gelu")
    assert "optimizing: fuse / fuse_bias_gelu" in capsys.readouterr().err


def test_a_phase_is_silent_when_off_or_piped(monkeypatch, capsys):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("TERM", "dumb")
    with phase("lowering to kernels", True) as update:  # capsys's stderr is no terminal
        update("still lowering")
    monkeypatch.setenv("FORCE_COLOR", "1")
    with phase("lowering to kernels", False) as update:  # --json
        update("still lowering")
    assert capsys.readouterr().err == ""
