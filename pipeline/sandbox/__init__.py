"""Local reference services (web, email, pricing, git host, Messages API) for demo, tests, chaos."""

from pipeline.sandbox.base import SandboxServer, read_log
from pipeline.sandbox.email import EmailSandbox
from pipeline.sandbox.githost import GitHostSandbox
from pipeline.sandbox.hooks import HookSandbox
from pipeline.sandbox.launcher import SandboxSet, start_all
from pipeline.sandbox.messages_api import MessagesSandbox
from pipeline.sandbox.pricing import PricingSandbox
from pipeline.sandbox.web import WebSandbox

__all__ = [
    "EmailSandbox",
    "GitHostSandbox",
    "HookSandbox",
    "MessagesSandbox",
    "PricingSandbox",
    "SandboxServer",
    "SandboxSet",
    "WebSandbox",
    "read_log",
    "start_all",
]
