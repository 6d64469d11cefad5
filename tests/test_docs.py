"""The docs stay true: every `python SCRIPT.py ...` command in a shell block of README.md and docs/*.md parses with
that script's own parser (its flags exist, their values have the right types, the recipe files it names exist),
without running the job; every link to a file, and to a heading of a page, resolves; README.md stays a front door."""
import argparse
import importlib.util
import pathlib
import re
import shlex
import sys
from types import SimpleNamespace

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_OPERATORS = {"|", "||", "&&", ";", ">", ">>", "2>&1", "&"}
README_MAX_LINES = 200


def shell_blocks(text):
    """(line number, command) of each command in the ```bash blocks of a page: continuation lines joined."""
    out, in_block, pending, start = [], False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            in_block = line.strip() in ("```bash", "```sh", "```shell")
            continue
        if not in_block:
            continue
        if not pending:
            start = number
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        out.append((start, pending.strip()))
        pending = ""
    return out


def script_command(command):
    """(script path, argv) of a `python SCRIPT.py args` command (after any VAR=value or wrapper such as taskset),
    or None for other commands (pip, bash, pytest, python -m ...)."""
    words = shlex.split(command, comments=True)
    at = next((i for i, w in enumerate(words) if w in ("python", "python3")), None)
    if at is None or at + 1 >= len(words) or not words[at + 1].endswith(".py"):
        return None
    argv = []
    for w in words[at + 2:]:
        if w in SHELL_OPERATORS:
            break
        argv.append(w)
    return words[at + 1], argv


COMMANDS = [(f"{page.relative_to(ROOT)}:{number}", *found)
            for page in PAGES for number, command in shell_blocks(page.read_text(encoding="utf-8"))
            if (found := script_command(command))]


class Parsed(Exception):
    """Raised where the script's parsing is done: nothing after it runs."""


def load_script(path):
    spec = importlib.util.spec_from_file_location("docs_command_" + re.sub(r"\W", "_", path), ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stop_after(fn):
    def parse_then_stop(*args, **kwargs):
        fn(*args, **kwargs)
        raise Parsed
    return parse_then_stop


def without_written_config_files(argv):
    """The --config_file values a documented command names that an earlier command writes (runs/...) cannot be
    read before that run: left out. Every other one must exist in the repository."""
    def written(i):
        w = argv[i]
        return (w.startswith("--config_file=runs/") or (w == "--config_file" and argv[i + 1:i + 2] != []
                                                          and argv[i + 1].startswith("runs/"))
                or (i > 0 and argv[i - 1] == "--config_file" and w.startswith("runs/")))
    return [w for i, w in enumerate(argv) if not written(i)]


def check_parses(path, argv, monkeypatch, tmp_path):
    """Run SCRIPT's main(argv) up to the end of its parsing; raise if the parser refuses the command."""
    from flaxlm.config import cli
    assert (ROOT / path).is_file(), f"{path} does not exist"
    module = load_script(path)
    argv = without_written_config_files(argv)
    monkeypatch.setattr(sys, "argv", [path, *argv])
    if getattr(module, "parse_args", None) is cli.parse_args:  # flaxlm's scripts: flags + recipes + values checked
        monkeypatch.setattr(module, "parse_args", stop_after(cli.parse_args))
    elif hasattr(module, "read_arguments"):  # fill_mask.py / fill_spans.py: MODEL_DIR and prompts
        (tmp_path / "config.json").write_text("{}")  # a model directory: the documented one is the user's
        real = module.read_arguments

        def read_then_stop(args, *rest, **kwargs):
            real([args[0], str(tmp_path), *args[2:]], *rest, **kwargs)
            raise Parsed
        monkeypatch.setattr(module, "read_arguments", read_then_stop)
    else:  # bench/ and lm_eval's command line: argparse
        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop_after(argparse.ArgumentParser.parse_args))
    if path == "train.py":  # the experiment's script, checked with the flags train.py resolved for it
        monkeypatch.setattr(module, "importlib", SimpleNamespace(import_module=lambda name: SimpleNamespace(
            main=lambda script_argv: check_parses(f"{name}.py", script_argv, monkeypatch, tmp_path))))
    takes_argv = "argv" in module.main.__code__.co_varnames[:module.main.__code__.co_argcount]
    try:
        module.main(argv) if takes_argv else module.main()
    except Parsed:
        return
    except SystemExit as e:  # --help, --list_presets: printed and done
        assert e.code in (0, None), f"{path} exited with {e.code}"


@pytest.mark.parametrize("where,path,argv", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_documented_command_parses(where, path, argv, monkeypatch, tmp_path, capsys):
    if path == "lm_eval_flaxlm.py":
        pytest.importorskip("lm_eval")
    try:
        check_parses(path, argv, monkeypatch, tmp_path)
    except (Exception, SystemExit) as e:
        err = capsys.readouterr().err.strip().splitlines()
        pytest.fail(f"{where}: `python {path} {shlex.join(argv)}` does not parse: {e!r} {err[-1] if err else ''}")


def headings(page):
    """GitHub's anchors of a page's headings."""
    out, in_block = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("```"):
            in_block = not in_block
        elif not in_block and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_links_resolve():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in headings(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading in {dest.name})")
    assert not broken, "\n".join(broken)


def test_every_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert not [p.name for p in PAGES[1:] if f"docs/{p.name}" not in readme]


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    assert re.search(r"^python3 -m venv .*bash demo\.sh$", text, re.M)  # the demo command
    assert re.search(r"^python3 -m venv .*pytest", text, re.M)  # the test command, run by .ci/run


def test_the_commands_are_found():
    """A change to the block syntax must not silently leave the commands unchecked."""
    scripts = {path for _, path, _ in COMMANDS}
    assert len(COMMANDS) >= 60 and {"run_mlm_flax.py", "run_sft.py", "bench/run.py", "train.py"} <= scripts


def test_the_layout_follows_the_code():
    """docs/developers.md's layout names every subpackage and module of flaxlm/ and every script."""
    layout = (ROOT / "docs" / "developers.md").read_text(encoding="utf-8")
    subpackages = [p.parent.name for p in (ROOT / "flaxlm").glob("*/__init__.py")]
    missing = [f"flaxlm/{name}/" for name in subpackages if f"`flaxlm/{name}/`" not in layout]
    missing += [str(p.relative_to(ROOT)) for p in (ROOT / "flaxlm").rglob("*.py")
                if p.name != "__init__.py" and p.parent.name != "suite" and f"`{p.name}`" not in layout
                and f"`flaxlm/{p.name}`" not in layout]
    missing += [p.name for p in ROOT.glob("*.py") if f"`{p.name}`" not in layout]
    assert not missing, f"docs/developers.md's layout does not name: {missing}"
