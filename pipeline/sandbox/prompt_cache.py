"""The Messages API's prompt cache, as far as usage reports it: what a request writes to the
cache at its breakpoints and what it reads from an earlier request's.

The prefix is tools, system, then each message's blocks. A breakpoint (`cache_control` on a
block) writes the prefix up to it; a later request reads the longest cached prefix that ends
at one of its block boundaries within 20 blocks before one of its breakpoints. Entries live
five minutes from their last use. Token counts are the sandbox's estimate (four characters a
token) of each block without its `cache_control`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

LOOKBACK_BLOCKS = 20
TTL_SECONDS = 300.0


def prefix_blocks(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's prompt as one sequence of blocks, in cache-prefix order."""
    blocks: list[dict[str, Any]] = [dict(tool) for tool in request.get("tools") or []]
    system = request.get("system")
    if isinstance(system, str) and system:
        blocks.append({"type": "text", "text": system})
    elif isinstance(system, list):
        blocks.extend(dict(block) for block in system if isinstance(block, dict))
    for message in request.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict):
                blocks.append({**block, "_role": message.get("role")})
    return blocks


def block_tokens(block: dict[str, Any]) -> int:
    bare = {k: v for k, v in block.items() if k not in ("cache_control", "_role")}
    return max(1, len(json.dumps(bare, sort_keys=True)) // 4)


class PromptCache:
    def __init__(self, *, min_tokens: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.min_tokens = min_tokens
        """Prefixes shorter than this are not cached (the real API: 1,024 to 4,096 tokens by
        model; 0 here, so the sandbox's short prompts cache too)."""
        self._clock = clock
        self._entries: dict[str, float] = {}
        """Prefix digest -> when it expires."""
        self._lock = threading.Lock()

    def usage(self, request: dict[str, Any]) -> dict[str, int]:
        """The input side of the request's usage, and the cache entries it writes."""
        blocks = prefix_blocks(request)
        tokens = [block_tokens(block) for block in blocks]
        total = sum(tokens)
        breakpoints = [i for i, block in enumerate(blocks) if block.get("cache_control")]
        if not breakpoints:
            return _usage(total, written=0, read=0)
        digests = _digests(str(request.get("model")), blocks)
        upto = [sum(tokens[: i + 1]) for i in range(len(blocks))]
        now = self._clock()
        with self._lock:
            hits = [
                i
                for bp in breakpoints
                for i in range(max(0, bp - LOOKBACK_BLOCKS), bp + 1)
                if self._entries.get(digests[i], 0.0) > now
            ]
            read_until = max(hits, default=-1)
            for i in [*breakpoints, read_until]:
                if i >= 0 and upto[i] >= self.min_tokens:
                    self._entries[digests[i]] = now + TTL_SECONDS
        last = breakpoints[-1]
        read = upto[read_until] if read_until >= 0 else 0
        written = upto[last] - read if upto[last] >= self.min_tokens else 0
        return _usage(total - read - written, written=written, read=read)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def _digests(model: str, blocks: list[dict[str, Any]]) -> list[str]:
    """One digest per block boundary: of the model and every block up to and including it."""
    running = hashlib.sha256(model.encode())
    digests = []
    for block in blocks:
        bare = {k: v for k, v in block.items() if k != "cache_control"}
        running.update(json.dumps(bare, sort_keys=True).encode())
        digests.append(running.copy().hexdigest())
    return digests


def _usage(uncached: int, *, written: int, read: int) -> dict[str, int]:
    return {
        "input_tokens": max(0, uncached),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
    }
