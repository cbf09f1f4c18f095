"""A TCP proxy on loopback that a test or the chaos soak can stop and start: a database
outage on demand.

``TcpProxy(target_port)`` listens on 127.0.0.1 (a free port) and forwards every
connection to ``127.0.0.1:target_port``. ``stop()`` closes the listener and every
forwarded connection (clients see their connections drop, new ones refused);
``start()`` listens again on the same port. Touches nothing but loopback.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> int:
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(64)
        self.port = ls.getsockname()[1]
        self._listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True, name="tcp-proxy").start()
        return self.port

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                client, _ = ls.accept()
            except OSError:
                return  # listener closed
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)  # the 5 s were for the connect; an idle pooled connection stays
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() in progress
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
