"""Check the certificate the gateway presents, as a caller does: connect (to loopback on the gateway itself), verify
the chain with the CA callers are given and the name they use, and say how many days it has left.

    python -m dcu_serving.gateway.tls_check --connect 127.0.0.1:4000 --name gw.lab.internal [--ca ca.pem]

Prints {"name", "names", "not_after", "days_left"} as JSON; exits 1 with what is wrong and its fix."""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import sys
import time


def check(connect: str, name: str, ca: str | None = None, timeout: float = 10.0) -> dict:
    host, port = connect.rsplit(":", 1)
    context = ssl.create_default_context(cafile=ca or None)
    with (socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw,
          context.wrap_socket(raw, server_hostname=name) as tls):
        cert = tls.getpeercert()
    not_after = ssl.cert_time_to_seconds(cert["notAfter"])
    return {"name": name, "names": [value for _, value in cert.get("subjectAltName", ())],
            "not_after": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(not_after)),
            "days_left": int((not_after - time.time()) // 86400)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connect", required=True, help="HOST:PORT the gateway listens on")
    parser.add_argument("--name", required=True, help="the name (or address) callers reach the gateway by")
    parser.add_argument("--ca", help="the CA callers verify with (default: this host's trust store)")
    args = parser.parse_args(argv)
    trust = args.ca or "this host's trust store"
    try:
        print(json.dumps(check(args.connect, args.name, args.ca)))
    except ssl.SSLCertVerificationError as e:
        print(f"the gateway's certificate does not verify for {args.name} with {trust}: {e.verify_message}; give "
              "dcu_gateway_tls_cert a certificate for that name signed by that CA (dcu_gateway_tls: lab makes "
              "one for a lab), or set dcu_gateway_public_url to the name the certificate has", file=sys.stderr)
        return 1
    except (OSError, ssl.SSLError) as e:
        print(f"no TLS answer from the gateway on {args.connect}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
