"""The Dockerfile, built as far as this machine can without a Docker engine (issue 33): its RUN
lines run as written, in order, with its ARG, ENV, WORKDIR and COPY, in a fresh virtual
environment (standing in for the base image's Python) and a mount namespace of their own whose
/etc is a copy without a nightshift user and whose /home is empty (standing in for the base
image's). The team's agents come in through the AGENTS build argument, as a team's would.
Checked: the team's agents are registered in the image's environment, and the data directory
exists, belongs to the user the image runs as, and that user can write in it."""

from __future__ import annotations

import shlex
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PACKAGES = "apt-get "
"""RUN lines installing the base image's system packages: this machine has them (git), and a
test must not change the machine's own packages."""


@dataclass
class Build:
    """What the Dockerfile says, in order: the steps to run and the image's final settings."""

    arguments: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = "root"
    steps: list[tuple[str, str, dict[str, str], str]] = field(default_factory=list)
    """(kind, argument, environment, workdir): kind RUN or COPY."""
    skipped: list[str] = field(default_factory=list)


def read_dockerfile(path: Path, build_args: dict[str, str]) -> Build:
    build = Build()
    text = path.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        rest = rest.strip()
        if instruction == "ARG":
            name, _, default = rest.partition("=")
            build.arguments[name] = build_args.get(name, default.strip('"'))
        elif instruction == "ENV":
            name, _, value = rest.partition("=")
            build.env[name] = value
        elif instruction == "WORKDIR":
            build.workdir = rest
        elif instruction == "USER":
            build.user = rest
        elif instruction == "RUN" and rest.startswith(SYSTEM_PACKAGES):
            build.skipped.append(rest)
        elif instruction in ("RUN", "COPY"):
            env = {**build.arguments, **build.env}
            build.steps.append((instruction, rest, env, build.workdir))
        else:
            assert instruction == "FROM", f"the test does not know {instruction}: {line}"
    return build


def _fresh_python(root: Path) -> Path:
    """A new virtual environment, the base image's Python: the packages nightshift requires are
    the test's own (a path added to it, so pip finds them installed and downloads nothing), and
    nothing of nightshift or the team's agents is installed in it."""
    venv = root / "venv"
    # Without its own pip (ensurepip takes long on a loaded machine): the test's pip is on the
    # added path, and bin/pip is the script pip's installer writes.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    lib = next((venv / "lib").glob("python3*")) / "site-packages"
    (lib / "requirements-of-the-test.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    pip = venv / "bin" / "pip"
    pip.write_text(
        f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom pip._internal.cli.main import main\n"
        "sys.exit(main())\n"
    )
    pip.chmod(0o755)
    return venv / "bin"


def _fresh_etc(root: Path, user: str) -> Path:
    """A copy of /etc without `user` (this machine may have one: the embedded servers')."""
    etc = root / "etc"
    shutil.copytree("/etc", etc, symlinks=True, ignore_dangling_symlinks=True)
    for name in ("passwd", "group", "shadow", "gshadow"):
        table = etc / name
        if table.exists():
            lines = table.read_text().splitlines(keepends=True)
            table.write_text("".join(x for x in lines if not x.startswith(f"{user}:")))
    return etc


def _script(build: Build, root: Path, python_bin: Path, etc: Path) -> str:
    """One shell script, run in a mount namespace: the steps, then what the test checks."""
    app = root / "image"
    lines = [
        "set -e",
        f"mount --bind {etc} /etc",
        "mount -t tmpfs tmpfs /home",
        f"export PATH={python_bin}:/usr/sbin:/usr/bin:/sbin:/bin",
    ]
    for kind, argument, env, workdir in build.steps:
        here = app / workdir.lstrip("/")
        lines.append(f"mkdir -p {here} && cd {here}")
        if kind == "COPY":
            *sources, target = argument.split()
            lines += [f"cp -r {REPO / source} {target}" for source in sources]
        else:
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            lines.append(f"env {exports} sh -c {shlex.quote(argument)}")
    data = build.env["NIGHTSHIFT_DATA_DIR"]
    as_user = f"setpriv --reuid={build.user} --regid={build.user} --init-groups"
    lines += [
        f'echo "owner: $(stat -c %U {data})"',
        f"{as_user} sh -c 'echo probe > {data}/probe && mkdir {data}/metrics' && echo writable",
        f"{python_bin}/python -c 'import importlib.metadata as m; "
        'print("agents:", *sorted(e.name for e in m.entry_points(group="nightshift.agents")))\'',
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_the_images_recipe_installs_a_teams_agents_and_a_writable_data_dir(
    tmp_path: Path,
) -> None:
    # given the Dockerfile with a team's package as its AGENTS build argument
    team = REPO / "examples" / "oncall_digest"
    build = read_dockerfile(REPO / "Dockerfile", {"AGENTS": str(team)})
    assert build.user == "nightshift" and "NIGHTSHIFT_DATA_DIR" in build.env
    assert [line.split()[0] for line in build.skipped] == ["apt-get"]
    # (copied: pip builds in the source tree, and the repository's must stay clean)
    shutil.copytree(team, tmp_path / "team", ignore=shutil.ignore_patterns("*.egg-info"))
    build = read_dockerfile(REPO / "Dockerfile", {"AGENTS": str(tmp_path / "team")})
    script = _script(build, tmp_path, _fresh_python(tmp_path), _fresh_etc(tmp_path, build.user))
    (tmp_path / "build.sh").write_text(script)
    # when its steps run as root in a namespace of their own
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", str(tmp_path / "build.sh")],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(tmp_path)},
    )
    if done.returncode != 0 and "unshare failed" in done.stderr:
        pytest.skip(f"cannot make a mount namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = done.stdout.splitlines()
    # then the data directory belongs to the service user, who can write in it
    assert f"owner: {build.user}" in said and "writable" in said, done.stdout[-2000:]
    # and the image's environment registers the team's agent beside the shipped ones
    agents = next(line for line in said if line.startswith("agents: ")).split()[1:]
    assert "oncall_digest" in agents and "nightly_report" in agents
