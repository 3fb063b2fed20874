"""Output files never write through a link, and a reader sees the old file or the whole new one."""

from __future__ import annotations

import os

import pytest

from streamcorr.offline.outfiles import move_into, staging_dir, write_file


def test_write_file_replaces_a_planted_link_and_leaves_its_target_alone(tmp_path):
    """A symlink (even a dangling one) at the output's name is replaced; the file it pointed to is untouched."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "a.json").symlink_to(victim)
    (tmp_path / "b.json").symlink_to(tmp_path / "nowhere")
    write_file(tmp_path / "a.json", b"A")
    write_file(tmp_path / "b.json", b"B")
    assert victim.read_text() == "keep" and not (tmp_path / "nowhere").exists()
    assert (tmp_path / "a.json").read_bytes() == b"A" and not (tmp_path / "a.json").is_symlink()
    assert (tmp_path / "b.json").read_bytes() == b"B"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json", "victim"]  # no part files left


def test_a_failed_write_leaves_the_old_file_and_no_part(tmp_path):
    """When the rename cannot happen (the name is a directory), the old content stays and nothing is left."""
    (tmp_path / "out").mkdir()
    with pytest.raises(OSError):
        write_file(tmp_path / "out", b"new")
    assert (tmp_path / "out").is_dir() and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_staged_files_move_into_place_over_links_and_the_staging_dir_goes(tmp_path):
    """Files written in a private staging dir replace links at their names; the staging dir is removed."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    out = tmp_path / "out"
    stage = staging_dir(out)
    assert oct(os.stat(stage).st_mode & 0o777) == "0o700"
    (stage / "timeline.parquet").write_bytes(b"T")
    (out / "timeline.parquet").symlink_to(victim)
    move_into(stage, out, ["timeline.parquet", "absent.parquet"])
    assert (out / "timeline.parquet").read_bytes() == b"T" and victim.read_text() == "keep"
    assert not stage.exists()
