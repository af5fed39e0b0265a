"""No torch: prints "ready", counts the SIGTERMs it receives until 1 s after the first one, prints the count."""

import signal
import time

count = 0


def on_term(signum, frame):
    global count
    count += 1


signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
deadline = time.monotonic() + 20
while count == 0 and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(1.0)  # a second SIGTERM, if one comes, arrives now
print(f"SIGTERM received {count} time(s)", flush=True)
