"""A process that takes the same-host socket name of a flinkbuf server before
the server does, for tests/test_network_squat.py.

    python squatter.py PORT MODE CAPTURE [UID]

It binds the abstract Unix socket ``"\\0flinkbuf-tcp-PORT"`` (as user UID
if given: it drops to that user first), prints ``ready`` and then, for
every connection to it, by MODE: ``relay`` connects to the server's TCP
port and passes bytes both ways; ``refuse`` closes at once; ``silent``
holds the connection and sends nothing.  Every byte a client sent to it
(and, relaying, every byte the server sent back) is appended to the file
CAPTURE, which must be writable by UID.  It runs until killed.
"""

import os
import socket
import sys
import threading


def pump(src, dst, capture, lock):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            with lock:
                with open(capture, "ab") as f:
                    f.write(data)
            if dst is not None:
                dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst) if dst is not None else ():
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def main():
    port, mode, capture = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if len(sys.argv) > 4:
        uid = int(sys.argv[4])
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"\0flinkbuf-tcp-{port}")
    listener.listen(16)
    print("ready", flush=True)
    lock = threading.Lock()
    held = []
    while True:
        client, _ = listener.accept()
        if mode == "refuse":
            client.close()
        elif mode == "silent":
            held.append(client)
            threading.Thread(target=pump, args=(client, None, capture, lock),
                             daemon=True).start()
        else:
            upstream = socket.create_connection(("127.0.0.1", port))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=pump, args=(src, dst, capture, lock),
                                 daemon=True).start()


if __name__ == "__main__":
    main()
