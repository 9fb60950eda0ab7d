"""The release store publishes atomically and never writes outside itself."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from medrelease.storage.store import ReleaseStore, StoreError


def _table() -> pd.DataFrame:
    return pd.DataFrame({"age": ["[10-19]", "*"], "diagnosis": ["A001", "B002"]})


def test_publish_writes_everything_then_renames(tmp_path: Path) -> None:
    store = ReleaseStore(tmp_path)
    published = store.publish("ds", "r1", _table(), {"release_id": "r1"},
                              extra_files={"report.md": "# hi"})
    assert published.path == tmp_path / "ds" / "r1"
    assert sorted(p.name for p in published.path.iterdir()) == [
        "data.csv", "data.parquet", "manifest.json", "report.md"]
    assert json.loads(published.manifest_path.read_text()) == {"release_id": "r1"}
    pd.testing.assert_frame_equal(pd.read_parquet(published.path / "data.parquet"), _table())
    assert store.releases("ds") == [published.path]
    with pytest.raises(StoreError, match="already exists"):
        store.publish("ds", "r1", _table(), {})


def test_failure_midway_leaves_no_release_and_no_partial_folder(tmp_path: Path) -> None:
    store = ReleaseStore(tmp_path)

    def explode(folder: Path) -> None:
        assert (folder / "manifest.json").exists()
        raise RuntimeError("disk went away")

    with pytest.raises(RuntimeError, match="disk went away"):
        store.publish("ds", "r2", _table(), {"x": 1}, before_rename=explode)
    assert list((tmp_path / "ds").iterdir()) == []
    assert store.releases() == []


def test_leftovers_of_a_crash_are_invisible_and_swept(tmp_path: Path) -> None:
    store = ReleaseStore(tmp_path)
    crashed = tmp_path / "ds" / ".partial-r0-abc"
    crashed.mkdir(parents=True)
    (crashed / "data.csv").write_text("half")
    assert store.releases() == []
    store.publish("ds", "r3", _table(), {})
    assert not crashed.exists()


def test_a_publish_never_sweeps_a_release_still_being_written(tmp_path: Path) -> None:
    """Issue 40: processes (or hosts, on a shared store) publishing at once removed each
    other's partial folder ("No such file or directory; nothing was published")."""
    import os
    import subprocess

    from medrelease.storage.store import _this_host

    gone = subprocess.Popen(["true"])  # a process that has exited: its pid is free
    gone.wait()
    writing = {name: tmp_path / "ds" / f".partial-r0@{name}"
               for name in (f"{_this_host()}@{os.getpid()}@aaaaaa",  # this process: alive
                            "other-host@123@bbbbbb")}                # another host, fresh
    crashed = tmp_path / "ds" / f".partial-r1@{_this_host()}@{gone.pid}@cccccc"
    for folder in [*writing.values(), crashed]:
        folder.mkdir(parents=True)
        (folder / "data.csv").write_text("half")
    ReleaseStore(tmp_path).publish("ds", "r3", _table(), {})
    assert all(folder.is_dir() for folder in writing.values()) and not crashed.exists()


@pytest.mark.parametrize("dataset", ["../escape", "/etc", "a/../../b", ".hidden", "", "x\x00y"])
def test_dataset_names_cannot_escape(tmp_path: Path, dataset: str) -> None:
    with pytest.raises(StoreError):
        ReleaseStore(tmp_path / "store").publish(dataset, "r", _table(), {})
    assert not (tmp_path / "escape").exists()


@pytest.mark.parametrize("destination", ["../../tmp", "/tmp/x", "ok/../../up", "..."])
def test_destinations_cannot_escape(tmp_path: Path, destination: str) -> None:
    with pytest.raises(StoreError, match=r"not allowed|relative path|outside"):
        ReleaseStore(tmp_path / "store").publish("ds", "r", _table(), {}, destination=destination)
    published = ReleaseStore(tmp_path / "store").publish("ds", "r", _table(), {},
                                                         destination="monthly/2026-11")
    assert published.path == tmp_path / "store" / "monthly" / "2026-11" / "ds" / "r"


def test_csv_groups_join_the_same_bytes_with_32_and_64_bit_offsets() -> None:
    """Rows are joined from a take of the distinct lines; the faster 32-bit-offset binary is
    used only while no group can reach 2 GiB, and both give the same bytes."""
    import numpy as np
    import pyarrow as pa

    from medrelease.storage.store import _binary_type, _joined

    lines = [f"{i},F,{i % 7}\n".encode() for i in range(1000)]
    lengths = np.asarray([len(line) for line in lines])
    assert _binary_type(lengths, 1_000_000) == pa.binary()
    assert _binary_type(lengths, 2**31 // 8) == pa.large_binary()  # 8-byte lines, 2 GiB group
    picks = np.random.default_rng(3).integers(0, len(lines), 5000)
    expected = b"".join(lines[i] for i in picks)
    for kind in (pa.binary(), pa.large_binary()):
        taken = pa.array(lines, type=kind).take(picks).slice(100)  # a slice: offset 100
        assert bytes(_joined(taken)) == b"".join(lines[i] for i in picks[100:])
    assert bytes(_joined(pa.array(lines, type=pa.binary()).take(picks))) == expected


def test_csv_lines_are_the_bytes_pandas_writes_for_the_whole_table() -> None:
    """The CSV's distinct lines, built column by column from distinct values (or cut from one
    ``to_csv``), are byte for byte the lines pandas writes for the table: quoting (commas,
    quotes, a leading formula sign), missing values, integers, nullable integers, text as
    categories, as ``str`` and as objects; floats and dates go the whole-table way; a value
    with a line break gives None (the caller then writes row groups with pandas)."""
    import numpy as np

    from medrelease.storage.store import _csv_lines, _joined_columns

    rng = np.random.default_rng(7)
    n = 3000
    texts = np.asarray(["plain", "with, comma", 'say "hi"', "'=SUM(A1)", "", "é ü", " lead"],
                       dtype=object)
    frame = pd.DataFrame({
        "cat": pd.Categorical(rng.choice(texts, n)).add_categories(["unused"]),
        "text": pd.Series(rng.choice(texts, n), dtype="str"),
        "obj": pd.Series(rng.choice(texts, n), dtype=object),
        "int": rng.integers(-5, 500, n),
        "nullable": pd.array(rng.integers(0, 9, n), dtype="Int64"),
        "age": pd.Categorical(rng.integers(0, 99, n).astype(str)),
    })
    frame.loc[rng.random(n) < 0.1, "cat"] = None
    frame.loc[rng.random(n) < 0.1, "nullable"] = None
    frame.loc[rng.random(n) < 0.1, "text"] = None
    cases = {"text and integers (joined per column)": frame,
             "a float column (the whole table)": frame.assign(x=rng.random(n)),
             "dates (the whole table)": frame.assign(
                 when=pd.Timestamp("2026-01-01") + pd.to_timedelta(rng.integers(0, 9, n), "D")),
             "two columns": frame[["age", "cat"]],
             # one value to factorize, three texts to to_csv (the rows decide, not the values)
             "objects 1, 1.0 and True": frame.assign(
                 mixed=pd.Series(np.resize(np.asarray([1, 1.0, True], dtype=object), n),
                                 dtype=object))}
    assert _joined_columns(frame) is not None and _joined_columns(cases["two columns"])
    assert _joined_columns(cases["a float column (the whole table)"]) is None
    for case, table in cases.items():
        expected = table.to_csv(index=False, lineterminator="\n").encode("utf-8")
        header, body = _csv_lines(table)
        assert len(body) == len(table), case
        assert header + b"".join(body.to_pylist()) == expected, case
    broken = frame.assign(obj=frame["obj"].where(frame.index != 5, "two\nlines"))
    assert _csv_lines(broken) is None


def test_a_publish_never_sweeps_a_reviewed_release_being_copied(tmp_path: Path,
                                                                monkeypatch) -> None:
    """A reviewed (staged) release is copied into a partial folder too: a publish running
    meanwhile must leave it (it once used the old name, which a sweep reads as a leftover)."""
    import shutil

    store = ReleaseStore(tmp_path / "store")
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "data.csv").write_text("a\n1\n")
    (staged / "manifest.json").write_text("{}")
    copy = shutil.copyfile

    def copy_then_publish_another(source, target):  # another run publishes mid-copy
        copy(source, target)
        if Path(source).name == "data.csv":
            store.publish("ds", "r-other", _table(), {})
        return target

    monkeypatch.setattr(shutil, "copyfile", copy_then_publish_another)
    published = store.publish_folder("ds", "r-reviewed", staged)
    assert (published.path / "data.csv").read_text() == "a\n1\n"
    assert (published.path / "manifest.json").is_file()
