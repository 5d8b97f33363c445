"""Test hosts for the network tests, run *inside* the test's own "internet"
network namespace (``ip netns exec``): never reachable from anywhere else.

- HTTP on :80 of every address: answers ``host=<the address it was reached on>``;
  ``/redirect?to=URL`` answers 302 to URL.
- TCP on :443: on every burst of bytes received, answers ``tls-echo <address>``
  (stands in for a TLS server: the tests send a ClientHello and check whether
  it arrived) and holds the connection open until the client closes it.
- TCP on :8080: reads until the client has been quiet for half a second, then
  answers one HTTP response whose body lists the ``Host`` header of every
  request it received (``hosts=a,b``) and closes: it shows what a proxy
  relayed, whatever the proxy asked it to do with the connection.
- DNS on ``<dns address>:53`` (UDP): A records from the JSON name map in argv;
  names under ``slow.test`` are never answered (an upstream that hangs).

Prints ``ready`` once everything listens; runs until killed.
"""

from __future__ import annotations

import http.server
import json
import socket
import socketserver
import struct
import sys
import threading
import urllib.parse


class Http(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/redirect?"):
            target = urllib.parse.parse_qs(self.path.split("?", 1)[1])["to"][0]
            self.send_response(302)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = f"host={self.connection.getsockname()[0]}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while self.request.recv(65536):
            self.request.sendall(f"tls-echo {self.request.getsockname()[0]}".encode())


class Collect(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.settimeout(0.5)
        received = b""
        try:
            while data := self.request.recv(65536):
                received += data
        except TimeoutError:
            pass
        hosts = [
            line.split(b":", 1)[1].strip().decode("latin-1")
            for line in received.split(b"\r\n")
            if line.lower().startswith(b"host:")
        ]
        body = ("hosts=" + ",".join(hosts)).encode()
        self.request.sendall(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body)
        )


class Threaded(socketserver.ThreadingMixIn, socketserver.TCPServer):
    allow_reuse_address = True
    daemon_threads = True


def serve_dns(address: str, names: dict[str, str]) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, 53))
    while True:
        data, peer = sock.recvfrom(512)
        qid = data[:2]
        pos, labels = 12, []
        while data[pos]:
            labels.append(data[pos + 1 : pos + 1 + data[pos]].decode())
            pos += 1 + data[pos]
        question = data[12 : pos + 5]
        qtype = struct.unpack("!H", data[pos + 1 : pos + 3])[0]
        name = ".".join(labels).lower()
        if name.endswith(".slow.test"):
            continue
        found = names.get(name)
        if found and qtype == 1:
            answer = struct.pack("!HHHIH", 0xC00C, 1, 1, 60, 4) + socket.inet_aton(found)
            sock.sendto(qid + struct.pack("!HHHHH", 0x8180, 1, 1, 0, 0) + question + answer, peer)
        else:
            rcode = 0 if found else 3
            sock.sendto(qid + struct.pack("!HHHHH", 0x8180 | rcode, 1, 0, 0, 0) + question, peer)


def main() -> None:
    dns_address, names = sys.argv[1], json.loads(sys.argv[2])
    servers = (
        Threaded(("0.0.0.0", 80), Http),
        Threaded(("0.0.0.0", 443), Echo),
        Threaded(("0.0.0.0", 8080), Collect),
    )
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    threading.Thread(target=serve_dns, args=(dns_address, names), daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
