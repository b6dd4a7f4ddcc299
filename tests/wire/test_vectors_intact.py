"""The golden vectors are the original's bytes: every file matches its SHA256SUMS digest."""

from __future__ import annotations

import hashlib

from testkit import vectors_dir

# Project notes that sit beside the vectors and are not theirs.
NOT_LISTED = {"README.md", "ABOUT.md", ".gitattributes"}


def test_every_vector_file_matches_its_digest() -> None:
    root = vectors_dir()
    listed: dict[str, str] = {}
    for line in (root / "SHA256SUMS").read_text(encoding="utf-8").splitlines():
        digest, _, name = line.partition("  ")
        listed[name.removeprefix("./")] = digest
    assert len(listed) > 100, "SHA256SUMS lists too few files to be the vectors"
    on_disk = {
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file() and path.name not in NOT_LISTED and path.name != "SHA256SUMS"
    }
    assert on_disk == set(listed), f"files not in SHA256SUMS or missing: {sorted(on_disk ^ set(listed))[:10]}"
    changed = [
        name
        for name, digest in listed.items()
        if hashlib.sha256((root / name).read_bytes()).hexdigest() != digest
    ]
    assert changed == [], f"vector files edited (digest differs from SHA256SUMS): {changed[:10]}"
