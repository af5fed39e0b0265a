"""A script that ends while accel's stall-watch thread is connecting to the store (tests/core/test_stall_watch_exit.py).

The job's store sits behind a proxy that holds the last answer of the watch thread's connection handshake for DELAY
seconds (which answer is last: counted on a first connection of the script's own), so at the thread's first poll
(0.5 s) it waits in torch's C++ when the script ends. The script's last exit handler (run after accel's) says whether
the thread is still alive; if it is, it returns just before the held answer goes through, so the thread leaves C++
while the interpreter finalizes - which, for a daemon thread, aborts the process ("terminate called without an
active exception") after the script succeeded."""

import atexit
import os
import socket
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

DELAY = float(sys.argv[1])
store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
answers: list[int] = []  # answers sent on each connection through the proxy, by connection
handshake: list[int] = []  # how many answers a client's connection handshake takes
released_at: list[float] = []  # when the held answer goes through


def pump(source: socket.socket, target: socket.socket, connection: int | None = None) -> None:
    while chunk := source.recv(65536):
        if connection is not None:
            answers[connection] += 1
            if connection > 0 and answers[connection] == handshake[0]:
                released_at.append(time.monotonic() + DELAY)
                time.sleep(DELAY)
        target.sendall(chunk)


def proxy(listener: socket.socket) -> None:
    while True:
        client, _ = listener.accept()
        upstream = socket.create_connection(("127.0.0.1", store.port))
        answers.append(0)
        threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client, len(answers) - 1), daemon=True).start()


listener = socket.create_server(("127.0.0.1", 0))
threading.Thread(target=proxy, args=(listener,), daemon=True).start()
port = listener.getsockname()[1]
dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
time.sleep(0.2)
handshake.append(answers[0])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))

from accel_core.settings import settle  # noqa: E402
from accel_core.stall_report import StallWatch  # noqa: E402

# polls every 0.5 s; the store is the one named by the settled record
watch = StallWatch(rank=1, world_size=2, threshold=2.0, timeout=None, environ=settle(os.environ).environ)


def last_exit_handler() -> None:
    alive = watch._thread.is_alive()
    print(f"after accel's exit handler: watch thread alive={alive} (handshake: {handshake[0]} answers)", flush=True)
    if alive:
        time.sleep(max(0.0, released_at[-1] - time.monotonic() - 0.005))


atexit.register(last_exit_handler)  # registered before the watch's handler, so it runs after it
watch.start()
deadline = time.monotonic() + 30
while not released_at:  # the watch thread's connection waits for its last handshake answer now
    assert time.monotonic() < deadline, "the watch thread did not connect"
    time.sleep(0.01)
