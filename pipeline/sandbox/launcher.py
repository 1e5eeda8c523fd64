"""Start every sandbox service at once: in-process (`start_all`) or `python -m pipeline.sandbox`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from dataclasses import dataclass, fields
from pathlib import Path
from types import FrameType
from typing import Any, Self

from pipeline.sandbox.base import SandboxServer
from pipeline.sandbox.email import MODES, EmailMode, EmailSandbox
from pipeline.sandbox.git_repos import seed_demo_repository, url_template
from pipeline.sandbox.githost import GitHostSandbox
from pipeline.sandbox.messages_api import MessagesSandbox
from pipeline.sandbox.pricing import PricingSandbox
from pipeline.sandbox.responders import Responder, default_responder
from pipeline.sandbox.web import WebSandbox

MANIFEST = "sandbox.json"


@dataclass
class SandboxSet:
    web: WebSandbox
    email: EmailSandbox
    pricing: PricingSandbox
    githost: GitHostSandbox
    messages: MessagesSandbox

    def servers(self) -> dict[str, SandboxServer]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def git_url(self) -> str:
        """NIGHTSHIFT_CONFIG_PATCH_GIT_URL for the git host's bare repositories."""
        assert self.githost.git_root is not None
        return url_template(self.githost.git_root)

    def describe(self) -> dict[str, Any]:
        """What `sandbox.json` holds: each service's URL, `git_url` (the remotes, for Patch),
        and `logs` with each delivery log."""
        servers = self.servers()
        return {
            **{name: server.url for name, server in servers.items()},
            "git_url": self.git_url,
            "logs": {name: str(server.log.path) for name, server in servers.items()},
        }

    def stop(self) -> None:
        for server in self.servers().values():
            server.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_all(
    dir: Path,
    *,
    email_mode: EmailMode = "keys",
    responder: Responder = default_responder,
    host: str = "127.0.0.1",
) -> SandboxSet:
    """Start all services on ephemeral ports of `host` (loopback unless worker hosts in
    network namespaces must reach them), with their delivery logs in `dir` and
    the git host's bare repositories (the demo repository seeded) in `dir/remotes`."""
    dir.mkdir(parents=True, exist_ok=True)
    remotes = dir / "remotes"
    seed_demo_repository(remotes)
    sandboxes = SandboxSet(
        web=WebSandbox(log_path=dir / "web.jsonl"),
        email=EmailSandbox(mode=email_mode, log_path=dir / "email.jsonl"),
        pricing=PricingSandbox(log_path=dir / "pricing.jsonl"),
        githost=GitHostSandbox(log_path=dir / "githost.jsonl", git_root=remotes),
        messages=MessagesSandbox(responder=responder, log_path=dir / "messages.jsonl"),
    )
    try:
        for server in sandboxes.servers().values():
            server.start(host)
    except BaseException:
        sandboxes.stop()
        raise
    return sandboxes


def write_manifest(sandboxes: SandboxSet, dir: Path) -> Path:
    """Write `dir/sandbox.json` atomically, so a reader polling for it never sees half a file."""
    path = dir / MANIFEST
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(sandboxes.describe(), indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.sandbox", description=__doc__)
    parser.add_argument("--dir", type=Path, required=True, help="where logs and sandbox.json go")
    parser.add_argument("--email-mode", choices=MODES, default="keys")
    args = parser.parse_args(argv)

    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with start_all(args.dir, email_mode=args.email_mode) as sandboxes:
        manifest = write_manifest(sandboxes, args.dir)
        print(f"sandbox services ready: {manifest}", file=sys.stderr, flush=True)
        while not stopping.wait(0.5):
            pass
    return 0
