"""Fixtures for the platform tests."""

import pytest


@pytest.fixture
def write_tree(tmp_path):
    """write_tree({"sys/class/x/type": "Battery", ...}) writes the files under tmp_path and
    returns tmp_path as a string."""
    def write(files: dict) -> str:
        for rel, text in files.items():
            path = tmp_path / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{text}\n")
        return str(tmp_path)
    return write
