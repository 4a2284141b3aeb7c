#!/usr/bin/python
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

DOCUMENTATION = r"""
---
module: lab_tls
short_description: A lab's certificate authority and a server certificate it signed, kept in one directory
version_added: 0.3.0
description:
  - For a lab or a test fleet without a site CA. Keeps a certificate authority in O(dir) (C(ca.pem), C(ca.key))
    and a server certificate for O(name) signed by it (C(<name>.pem), C(<name>.key)), valid for O(names).
  - The CA is made once and kept; callers verify the server with C(ca.pem). The server certificate is made again
    when it is missing, names other names than O(names), was not signed by this CA, or expires within 30 days.
  - Keys are written 0600 and never returned. Run on the controller (delegated to C(localhost)), so that the
    directory is recorded beside the inventory; it needs Python's C(cryptography), which ansible-core requires.
  - A site with its own CA gives the certificate and key from ansible-vault instead; see the dcu_gateway role.
author:
  - dcu-serving contributors (@dcu-serving)
extends_documentation_fragment:
  - dcu.serving.attributes
attributes:
  check_mode:
    support: full
    details: Says what it would make, writes nothing.
  diff_mode:
    support: full
    details: The server certificate's names and expiry before and after.
options:
  dir:
    description: The directory of the CA and the certificates (created 0700).
    type: path
    required: true
  name:
    description: The server's name, the stem of its files.
    type: str
    required: true
  names:
    description: Every name and address callers reach the server by (subject alternative names); IP addresses are
      recognised as such.
    type: list
    elements: str
    required: true
  days:
    description: Days the server certificate is valid.
    type: int
    default: 825
"""

EXAMPLES = r"""
- name: Make the lab's certificate for the gateway
  dcu.serving.lab_tls:
    dir: "{{ inventory_dir }}/tls"
    name: gateway
    names: [gateway.lab.internal, 10.0.0.5, 127.0.0.1]
  delegate_to: localhost
"""

RETURN = r"""
ca:
  description: The CA's certificate, which callers verify the server with.
  returned: always
  type: str
  sample: /srv/inventories/lab/tls/ca.pem
cert:
  description: The server certificate.
  returned: always
  type: str
  sample: /srv/inventories/lab/tls/gateway.pem
key:
  description: The server certificate's key (0600).
  returned: always
  type: str
  sample: /srv/inventories/lab/tls/gateway.key
not_after:
  description: When the server certificate expires (UTC, ISO 8601), or null in check mode when it would be made.
  returned: always
  type: str
  sample: "2029-03-10T08:00:00"
made:
  description: What was made (or would be, in check mode) - C(ca) and the server's name.
  returned: changed
  type: list
  elements: str
  sample: [ca, gateway]
reason:
  description: Why the server certificate was made - missing, not signed by this CA, other names, near its end.
  returned: changed
  type: str
  sample: "names gateway, 10.0.0.5, wanted gateway, 10.0.0.5, 10.0.0.100"
"""

import datetime
import ipaddress
import os
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    HAS_CRYPTOGRAPHY, CRYPTOGRAPHY_ERROR = True, None
except ImportError:
    HAS_CRYPTOGRAPHY, CRYPTOGRAPHY_ERROR = False, traceback.format_exc()

RENEW_BEFORE = datetime.timedelta(days=30)


def _now():
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)


def _san(names):
    entries = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return entries


def _names_of(cert):
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return sorted(str(entry.value) for entry in san)


def _not_after(cert):
    value = getattr(cert, "not_valid_after_utc", None)  # cryptography 42 and later
    return value.replace(tzinfo=None) if value else cert.not_valid_after


def _write(path, data, mode):
    """Created with its final mode (a key is never readable by others, not even for an instant), then renamed."""
    scratch = path + ".new"
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(scratch, path)


def _key_pem(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _certificate(subject, issuer, public_key, signer, days, ca, names=()):
    start = _now() - datetime.timedelta(minutes=5)  # a clock a little behind still accepts it
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
               .serial_number(x509.random_serial_number()).not_valid_before(start)
               .not_valid_after(start + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                                        critical=True)
    else:
        builder = (builder.add_extension(x509.SubjectAlternativeName(_san(names)), critical=False)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
    return builder.sign(signer, hashes.SHA256())


def _load_ca(ca_pem, ca_key):
    with open(ca_pem, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    with open(ca_key, "rb") as f:
        key = serialization.load_pem_private_key(f.read(), password=None)
    return cert, key


def _why_remake(cert_path, ca_cert, names):
    """Why the server certificate must be made (again), or None when it serves as it is."""
    if not os.path.exists(cert_path):
        return "missing"
    with open(cert_path, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    if ca_cert is None or cert.issuer != ca_cert.subject:
        return "not signed by this CA"
    try:
        ca_cert.public_key().verify(cert.signature, cert.tbs_certificate_bytes,
                                    ec.ECDSA(cert.signature_hash_algorithm))
    except Exception:  # any verification failure means another CA's key signed it
        return "not signed by this CA"
    if _names_of(cert) != sorted(str(e.value) for e in _san(names)):
        return "names %s, wanted %s" % (", ".join(_names_of(cert)), ", ".join(names))
    if _not_after(cert) - _now() < RENEW_BEFORE:
        return "expires %s" % _not_after(cert).isoformat()
    return None


def main():
    module = AnsibleModule(argument_spec=dict(
        dir=dict(type="path", required=True),
        name=dict(type="str", required=True),
        names=dict(type="list", elements="str", required=True),
        days=dict(type="int", default=825),
    ), supports_check_mode=True)
    if not HAS_CRYPTOGRAPHY:
        module.fail_json(msg=missing_required_lib("cryptography"), exception=CRYPTOGRAPHY_ERROR)
    p = module.params
    if not p["names"]:
        module.fail_json(msg="names is empty: give every name and address callers reach %s by" % p["name"])
    if "/" in p["name"] or p["name"] in ("ca", "", ".", ".."):
        module.fail_json(msg="name %r cannot be a file stem beside ca.pem: use the server's host name" % p["name"])
    ca_pem, ca_key = os.path.join(p["dir"], "ca.pem"), os.path.join(p["dir"], "ca.key")
    cert_path, key_path = os.path.join(p["dir"], p["name"] + ".pem"), os.path.join(p["dir"], p["name"] + ".key")
    result = dict(changed=False, ca=ca_pem, cert=cert_path, key=key_path, not_after=None)

    make_ca = not (os.path.exists(ca_pem) and os.path.exists(ca_key))
    ca_cert, ca_signer = (None, None) if make_ca else _load_ca(ca_pem, ca_key)
    why = _why_remake(cert_path, ca_cert, p["names"])
    before = ""
    if os.path.exists(cert_path):
        with open(cert_path, "rb") as f:
            old = x509.load_pem_x509_certificate(f.read())
        before = "names: %s\nnot_after: %s\n" % (", ".join(_names_of(old)), _not_after(old).isoformat())
        result["not_after"] = _not_after(old).isoformat()
    if why is None:
        module.exit_json(**result)

    result.update(changed=True, made=(["ca"] if make_ca else []) + [p["name"]], reason=why)
    if module.check_mode:
        result["not_after"] = None
        result["diff"] = dict(before=before, after="names: %s\n(made: %s)\n" % (", ".join(p["names"]), why))
        module.exit_json(**result)
    if not os.path.isdir(p["dir"]):
        os.makedirs(p["dir"], 0o700)
    if make_ca:
        ca_signer = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dcu-serving lab CA")])
        ca_cert = _certificate(name, name, ca_signer.public_key(), ca_signer, 3650, ca=True)
        _write(ca_key, _key_pem(ca_signer), 0o600)
        _write(ca_pem, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, p["names"][0])]), ca_cert.subject,
                        key.public_key(), ca_signer, p["days"], ca=False, names=p["names"])
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    result["not_after"] = _not_after(cert).isoformat()
    after = "names: %s\nnot_after: %s\n" % (", ".join(_names_of(cert)), result["not_after"])
    result["diff"] = dict(before=before, after=after)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
