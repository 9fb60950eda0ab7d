"""``aim``'s compiled programs: jax's persistent cache folder (under the data home, switchable
off, never a failure when it cannot be written) and one program per model structure (a second
fit of the same structure compiles nothing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from medrelease.synthetic import pgm


def test_the_compile_cache_lives_under_the_data_home_by_default(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(pgm.COMPILE_CACHE_ENV, raising=False)
    folder = pgm.compile_cache_folder()
    assert folder == (tmp_path / "home" / "cache" / "jax").resolve() and folder.is_dir()
    assert list(folder.iterdir()) == []  # the write probe left nothing behind


def test_the_compile_cache_can_be_switched_off_or_moved(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(pgm.COMPILE_CACHE_ENV, "off")
    assert pgm.compile_cache_folder() is None
    monkeypatch.setenv(pgm.COMPILE_CACHE_ENV, str(tmp_path / "elsewhere"))
    assert pgm.compile_cache_folder() == tmp_path / "elsewhere"


def test_an_unwritable_compile_cache_folder_just_disables_the_cache(tmp_path: Path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(pgm.COMPILE_CACHE_ENV, str(blocker / "jax"))  # cannot be made
    assert pgm.compile_cache_folder() is None
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o500)
    try:
        monkeypatch.setenv(pgm.COMPILE_CACHE_ENV, str(read_only))
        probe = read_only / "probe"
        try:  # root writes anywhere: then the folder IS writable and is used
            probe.write_text("")
            probe.unlink()
            writable = True
        except OSError:
            writable = False
        assert (pgm.compile_cache_folder() is None) is not writable
    finally:
        read_only.chmod(0o700)


def test_a_second_fit_of_the_same_structure_compiles_nothing():
    from jax._src import monitoring

    compiled: list[float] = []

    def count(event: str, seconds: float, **_kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(seconds)

    domain = pgm.domain(("a", "b", "c"), (3, 4, 2))
    rng = np.random.default_rng(0)

    def fit(shift: float, warm=None):
        measurements = [pgm.measurement(rng.normal(50 + shift, 3, 12), ("a", "b"), 2.0, None),
                        pgm.measurement(rng.normal(75 + shift, 3, 8), ("b", "c"), 2.0, None)]
        return pgm.estimate(domain, measurements, 100, 600.0 + shift, warm_start=warm,
                            tol=1e-4)

    monitoring.register_event_duration_secs_listener(count)
    try:
        first = fit(0.0)
        warm = fit(3.0, warm=first)  # a warm start is its own program, once
        before = len(compiled)
        again = fit(5.0)
        warm_again = fit(8.0, warm=again)
        assert len(compiled) == before, "a fit of the same structure compiled again"
    finally:
        monitoring.unregister_event_duration_listener(count)
    for model, shift in ((first, 0.0), (warm, 3.0), (again, 5.0), (warm_again, 8.0)):
        total = float(np.asarray(model.marginals.project(("a",)).datavector()).sum())
        assert abs(total - (600.0 + shift)) < 1e-6 * total  # the known total is kept
