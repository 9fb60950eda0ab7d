"""A release store on a full or a read-only filesystem (real tmpfs mounts) fails cleanly."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from flows.release import ReleaseRequest, release_flow
from medrelease.privacy.ledger import Ledger
from medrelease.storage.store import StoreError


def _mount(target: Path, options: str) -> bool:
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
                          capture_output=True, check=False)
    return done.returncode == 0


pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.mark.parametrize(("options", "message"), [
    ("size=64k", "No space left on device"),
    ("ro,size=1m", "Read-only file system"),
])
def test_full_or_read_only_store_fails_cleanly(tmp_path: Path, monkeypatch, options: str,
                                               message: str) -> None:
    store = tmp_path / "store"
    if not _mount(store, options):
        pytest.skip("cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)")
    try:
        monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
        monkeypatch.setenv("MEDRELEASE_TEST_STORE", str(store))  # seed 1: a TEST release
        with pytest.raises(StoreError, match=message):
            release_flow(ReleaseRequest(seed=1, mechanism="ipa", evaluate=False))  # (fast)
        # nothing visible in the store: at most a hidden partial folder, never a release
        visible = [p for p in store.rglob("*") if not any(
            part.startswith(".partial") for part in p.relative_to(store).parts)]
        assert [p for p in visible if p.is_file()] == []
        spends = Ledger(tmp_path / "home" / "ledger.sqlite").spends()
        if options.startswith("ro"):  # found when the destination is checked: before the charge
            assert spends == []
        else:  # a full disk shows only while writing: the charge stays, marked failed
            [spend] = spends
            assert spend.status == "failed" and message in (spend.note or "")
    finally:  # lazily if a handle of the failed write is still open: no mount left behind
        if subprocess.run(["umount", str(store)], check=False).returncode:
            subprocess.run(["umount", "-l", str(store)], check=False)
