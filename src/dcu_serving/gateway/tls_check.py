"""Check the certificate a server presents, as its callers do: connect (to loopback on the gateway itself, or to a
serving host's dcu-proxy as the gateway calls it), verify the chain with the CA callers are given and the name they
use, and say how many days it has left.

    python -m dcu_serving.gateway.tls_check --connect 127.0.0.1:4000 --name gw.lab.internal [--ca ca.pem]
    python -m dcu_serving.gateway.tls_check --connect 10.0.0.11:8443 --name 10.0.0.11 --ca hosts-ca.pem \
        --what "dcu-proxy of node-a" --fix "give dcu_proxy_tls_cert of node-a a certificate for that name"

Prints {"name", "names", "not_after", "days_left"} as JSON; exits 1 with what is wrong and its fix."""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import sys
import time

GATEWAY_FIX = ("give dcu_gateway_tls_cert a certificate for that name signed by that CA (dcu_gateway_tls: lab makes "
               "one for a lab), or set dcu_gateway_public_url to the name the certificate has")


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
    parser.add_argument("--what", default="the gateway", help="the server, as the messages name it")
    parser.add_argument("--fix", default=GATEWAY_FIX, help="what to do when the certificate does not verify")
    args = parser.parse_args(argv)
    trust = args.ca or "this host's trust store"
    try:
        print(json.dumps(check(args.connect, args.name, args.ca)))
    except ssl.SSLCertVerificationError as e:
        print(f"{args.what}'s certificate does not verify for {args.name} with {trust}: {e.verify_message}; "
              f"{args.fix}", file=sys.stderr)
        return 1
    except (OSError, ssl.SSLError) as e:
        print(f"no TLS answer from {args.what} on {args.connect}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
