"""README.md's commands: every one has a check in scripts/readme_walk.py (the walk that runs
them as written on a fresh clone), so a command added to the README without saying what it
promises fails here."""

from __future__ import annotations

import importlib.util
import re
import sys

from tests.helpers import ROOT


def walk_module():
    spec = importlib.util.spec_from_file_location("readme_walk", ROOT / "scripts" / "readme_walk.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_readme_command_has_exactly_one_check():
    walk = walk_module()
    commands = walk.readme_commands((ROOT / "README.md").read_text())
    assert [c.line for c in commands][:2] == ["make train", "make test"]  # the two set-up commands first
    checks = [walk.check_for(c) for c in commands]  # raises for a command with none or several
    assert len(set(checks)) == len(checks)  # and no check serves two commands
    assert len(checks) == len(walk.CHECKS)  # and no check is left without its command


def test_readme_placeholders_are_the_ones_the_walk_fills():
    walk = walk_module()
    text = " ".join(c.line for c in walk.readme_commands((ROOT / "README.md").read_text()))
    assert set(re.findall(r"<[^>]+>", text)) <= {"<time>", "<policy time>", "<sweep>"}
