"""pyproject.toml: a wheel built from the clone holds every module of the package and requirements.txt's pins,
and the installed package imports on its own, away from the clone."""
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def as_pin(text):
    """(name, version set) of a requirement line, whatever the order of its specifiers."""
    from packaging.requirements import Requirement
    r = Requirement(text)
    return r.name, str(r.specifier)


def test_wheel_holds_the_package_and_the_pins(tmp_path):
    source = tmp_path / "source"  # a copy: building writes build/ and *.egg-info next to pyproject.toml
    shutil.copytree(ROOT / "flaxlm", source / "flaxlm", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "requirements.txt", "requirements-eval.txt",
                 "requirements-trackers.txt"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(source)], check=True, capture_output=True, timeout=300, cwd=tmp_path)
    (wheel,) = tmp_path.glob("flaxlm-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    ours = {str(p.relative_to(ROOT)) for p in (ROOT / "flaxlm").rglob("*.py")}
    assert ours <= names, sorted(ours - names)
    pins = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.strip()[:1] not in ("", "#")]
    required = [line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    assert sorted(map(as_pin, (r for r in required if "extra ==" not in r))) == sorted(map(as_pin, pins))
    for extra_name in ("eval", "trackers"):  # pip install 'flaxlm[eval]': lm-evaluation-harness; [trackers]: W&B...
        extra_pins = [line for line in (ROOT / f"requirements-{extra_name}.txt").read_text().splitlines()
                      if line.strip()[:1] not in ("", "#")]
        extra = [r.split(";")[0] for r in required if f'extra == "{extra_name}"' in r]
        assert sorted(map(as_pin, extra)) == sorted(map(as_pin, extra_pins)), extra_name

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = "import flaxlm, flaxlm.models, flaxlm.training.loop; print(flaxlm.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(str(site))  # the installed copy, not the clone
