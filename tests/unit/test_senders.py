"""A worker's webhook senders take the receivers in turn, one delivery in flight per receiver:
a receiver whose sends are slow holds one sender, never another receiver's deliveries, and a
full queue refuses (the tick sends it later) without losing what is in flight."""

from __future__ import annotations

import threading
import time
from typing import Any

from pipeline.delivery.receivers import Senders


def test_a_slow_receiver_holds_one_sender_and_the_others_go_past_it() -> None:
    release = threading.Event()
    done: list[str] = []
    in_flight: list[str] = []

    def send(item: Any) -> None:
        receiver = str(item).split("/")[0]
        in_flight.append(receiver)
        if receiver == "slow":
            release.wait(10)
        done.append(str(item))

    pool = Senders(threads=2, queued=10, per_receiver=5)
    for n in range(4):
        assert pool.hand_off(send, f"slow/{n}", "slow")
    for n in range(3):
        assert pool.hand_off(send, f"fast/{n}", "fast")
    deadline = time.monotonic() + 5
    while len([d for d in done if d.startswith("fast")]) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    # the fast receiver's three were sent while the slow one's first still held its sender
    assert [d for d in done if d.startswith("fast")] == ["fast/0", "fast/1", "fast/2"]
    assert in_flight.count("slow") == 1 and not any(d.startswith("slow") for d in done)
    release.set()
    deadline = time.monotonic() + 5
    while len(done) < 7 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [d for d in done if d.startswith("slow")] == [f"slow/{n}" for n in range(4)]


def test_no_room_is_a_refusal_and_the_senders_keep_going() -> None:
    release = threading.Event()
    done: list[str] = []

    def send(item: Any) -> None:
        if item == "a/0":
            release.wait(10)
        done.append(str(item))

    pool = Senders(threads=1, queued=1, per_receiver=1)
    assert pool.hand_off(send, "a/0", "a")
    time.sleep(0.2)  # taken: in flight, nothing of `a` waiting
    assert pool.hand_off(send, "b/0", "b")
    assert not pool.hand_off(send, "b/1", "b")  # its receiver's room
    assert not pool.hand_off(send, "a/1", "a")  # the whole room, while `a` is in flight
    release.set()
    deadline = time.monotonic() + 5
    while len(done) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done == ["a/0", "b/0"]
    assert pool.hand_off(send, "a/2", "a")  # the sender lived through it
    deadline = time.monotonic() + 5
    while len(done) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done == ["a/0", "b/0", "a/2"]
