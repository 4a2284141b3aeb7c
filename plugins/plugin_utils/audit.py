# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The audit report of verify.yml: what a host runs and where each piece came from (serving_audit's reading,
dcu_facts, cluster_health, dcu_device_access, the bundle's index.json), its problems, and its drift from the
inventory and the bundle. Plain data in, plain data out, so the JSON, the Markdown and the tests agree; the
writers at the end put the reports into the report directory (serving_audit's action plugin calls them)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fcntl
import json
import os
import tempfile
import time


def _artifact(bundle, kind, sha256=None, ref=None):
    """The bundle's artifact of `kind` with that sum or image ref, or None."""
    for artifact in (bundle or {}).get("artifacts") or []:
        if artifact.get("kind") != kind:
            continue
        if (sha256 and artifact.get("sha256") == sha256) or (ref and ref in (artifact.get("refs") or [])):
            return artifact
    return None


def _installed(kind, record, bundle, pinned, variable, drift):
    """Report entry of a driver or DTK install record; its drift appended to `drift`."""
    record = record or {}
    if not record.get("sha256"):
        drift.append("%s: no install record (it was not installed by dcu.serving.dcu_driver)" % kind)
        return {"version": None, "file": None, "sha256": None, "in_bundle": None}
    in_bundle = None
    if bundle:
        in_bundle = _artifact(bundle, "driver" if kind == "driver" else kind, sha256=record["sha256"]) is not None
        if not in_bundle:
            drift.append("%s: installed from %s (sha256 %s), which the bundle does not hold" % (
                kind, record.get("file"), record["sha256"]))
    if pinned and record.get("version") != pinned:
        drift.append("%s: %s installed, the inventory pins %s (%s)" % (kind, record.get("version"), pinned, variable))
    return {"version": record.get("version"), "file": record.get("file"), "sha256": record["sha256"],
            "in_bundle": in_bundle}


def _package(package):
    """The install record's package ({name, version}, or a string as older records hold it) as one string."""
    if isinstance(package, dict):
        return " ".join(str(package[k]) for k in ("name", "version") if package.get(k)) or None
    return package


def audit_report(gathered, host, facts=None, health=None, access=None, bundle=None, expected=None, orid=None,
                 generated=None, instances=None):
    """One host's report: a dict of plain values (see docs/operations.md, "Audit")."""
    facts, health, expected = facts or {}, health or {}, expected or {}
    # The instances that run the Python a model directory ships (vLLM's --trust-remote-code): a service's opt-in.
    remote_code = [{"unit": i.get("unit"), "model": i.get("model"), "model_dir": i.get("model_dir")}
                   for i in instances or [] if i.get("trust_remote_code")]
    drift, problems = [], []

    cards = facts.get("card_count")
    if expected.get("cards") and cards != expected["cards"]:
        drift.append("cards: %s found, the inventory expects %s (dcu_vllm_expected_cards)" % (cards, expected["cards"]))

    loaded = facts.get("driver") or {}
    driver = dict(_installed("driver", gathered.get("driver"), bundle, expected.get("driver_version"),
                             "dcu_driver_version", drift),
                  module=loaded.get("module"), loaded_version=loaded.get("version"),
                  package=_package((gathered.get("driver") or {}).get("package")))
    if not loaded.get("loaded"):
        problems.append("driver: no DCU kernel module is loaded")

    dtk_record = gathered.get("dtk") or {}
    dtk = dict(_installed("dtk", dtk_record, bundle, expected.get("dtk_version"), "dcu_driver_dtk_version", drift),
               path=dtk_record.get("link"), active_version=(facts.get("dtk") or {}).get("version"))
    if dtk["version"] and dtk["active_version"] and dtk["version"] != dtk["active_version"]:
        drift.append("dtk: %s is active, %s was installed" % (dtk["active_version"], dtk["version"]))

    # hyhal: a standalone tarball's marker says "<file> sha256:<sum> over rock <version>"; else the driver's own.
    hy = gathered.get("hyhal") or {}
    marker = (hy.get("marker") or "").split()
    if len(marker) >= 2 and marker[1].startswith("sha256:"):
        hyhal = {"path": hy.get("path"), "version": hy.get("version"), "file": marker[0],
                 "sha256": marker[1][len("sha256:"):], "from": "standalone tarball"}
    else:
        hyhal = {"path": hy.get("path"), "version": hy.get("version") or driver["version"], "file": driver["file"],
                 "sha256": driver["sha256"], "from": "the driver package"}

    images = []
    for entry in gathered.get("images") or []:
        artifact = _artifact(bundle, "image", ref=entry["ref"]) or {}
        image = {"name": artifact.get("name"), "ref": entry["ref"], "config_digest": entry.get("id"),
                 "file": artifact.get("file"), "sha256": artifact.get("sha256")}
        images.append(image)
        if not entry.get("id"):
            drift.append("image %s: the container engine does not hold it (run images.yml)" % entry["ref"])
        elif bundle and not artifact:
            drift.append("image %s: the bundle does not hold it" % entry["ref"])
        elif artifact and artifact.get("config_digest") and artifact["config_digest"] != entry["id"]:
            drift.append("image %s: the engine holds %s, the bundle's %s is %s (run images.yml with "
                         "dcu_images_force)" % (entry["ref"], entry["id"], artifact.get("file"),
                                                artifact["config_digest"]))
    by_ref = dict((i["ref"], i["config_digest"]) for i in images)
    for c in gathered.get("containers") or []:
        if c.get("image_id") and by_ref.get(c.get("image")) and c["image_id"] != by_ref[c["image"]]:
            drift.append("container %s runs an older %s (%s; the engine's is %s) - serving.yml restarts it on the "
                         "loaded one" % (c["name"], c["image"], c["image_id"], by_ref[c["image"]]))

    models = gathered.get("models") or []
    for m in models:
        if not m.get("exists"):
            drift.append("model: %s does not exist (dcu_vllm_model_dir)" % m.get("path"))
        elif not m.get("config_sha256"):
            drift.append("model: %s has no config.json" % m.get("path"))

    units = [dict((k, u.get(k)) for k in ("unit", "state", "active", "sub", "result", "restarts"))
             for u in health.get("units") or []]
    problems.extend("%s %s" % (u["unit"], u["state"]) for u in units if u["state"] != "active")
    # No health result: an earlier check of verify.yml failed (its own message says which).
    healthy = "%s/%s" % (health.get("healthy", 0), expected.get("instances", health.get("total", 0))) \
        if health else "not checked"
    if health.get("failed"):
        problems.append("verify: %s" % health.get("msg"))
    users = []
    for result in access or []:
        found = result.get("problems") or ([result["msg"]] if result.get("failed") and result.get("msg") else [])
        users.append({"user": result.get("user") or result.get("item"), "ok": not found, "problems": found})
        problems.extend("device access of %s: %s" % (users[-1]["user"], p) for p in found)

    return {
        "host": host, "generated": generated, "orid": orid, "ok": not drift and not problems,
        "healthy": healthy, "cards": {"found": cards, "expected": expected.get("cards") or None,
                                      "source": facts.get("source")},
        "driver": driver, "dtk": dtk, "hyhal": hyhal, "images": images,
        "containers": gathered.get("containers") or [], "models": models, "remote_code": remote_code,
        "proxy": gathered.get("proxy") or {},
        "units": units, "device_access": users,
        "requests": [dict((k, r.get(k)) for k in ("model", "api", "status", "backend", "latency_s"))
                     for r in health.get("requests") or []],
        "problems": problems, "drift": drift,
    }


def audit_fleet(reports, generated=None, gateway=None):
    """The fleet's summary from the hosts' reports, and what verify.yml's gateway play found (`gateway`, as
    audit_gateway makes it), when there is a gateway."""
    reports = [r for r in reports if r]
    fleet = {"generated": generated, "hosts": len(reports), "ok": sum(1 for r in reports if r["ok"]),
             "summary": [{"host": r["host"], "ok": r["ok"], "healthy": r["healthy"],
                          "driver": r["driver"]["version"], "dtk": r["dtk"]["version"],
                          "images": dict((i["ref"], i["config_digest"]) for i in r["images"]),
                          "model": dict((m["path"], m["content_sha256"]) for m in r["models"]),
                          "problems": r["problems"], "drift": r["drift"]} for r in reports]}
    if gateway:
        fleet["gateway"] = gateway
    return fleet


def _model_health(health, model):
    """'healthy/total' of a host's backends serving `model`, from its cluster_health result, or None."""
    backends = [b for b in (health or {}).get("backends") or [] if model in (b.get("models") or [])]
    if not backends:
        return None
    return "%d/%d" % (sum(1 for b in backends if b.get("healthy")), len(backends))


def audit_gateway(probes, gateway, generated=None, health=None, drained=None):
    """What the gateway reaches: one entry per serving host and model, from verify.yml's probes of the gateway's
    /health?model_id=<host>/<model> (`probes`: [{host, model, answered, sent, error}]) and, where the host was
    verified in the same run, its own N/N for that model behind its dcu-proxy (`health`: {host: cluster_health}).
    `drained`: the gateway's drained-hosts file ({host: {since, reason}}). /health goes past routing, so a host a
    failed play left drained answers there while callers never reach it: that is a problem of its own."""
    health, drained = health or {}, drained or {}
    deployments = []
    for p in probes:
        left_out = drained.get(p["host"])
        entry = {"host": p["host"], "model": p["model"], "reached": "%d/%d" % (p["answered"], p["sent"]),
                 "ok": p["sent"] > 0 and p["answered"] == p["sent"] and left_out is None,
                 "error": p.get("error") or None, "healthy": _model_health(health.get(p["host"]), p["model"]),
                 "drained": _drained_note(left_out)}
        deployments.append(entry)
    failed = ["%s %s (%s)" % (d["host"], d["model"], d["error"] or "unreachable") for d in deployments
              if not d["ok"] and not d["drained"]]
    problems = ["the gateway does not reach " + f for f in failed]
    problems += ["the gateway leaves %s out of its rotation (drained %s): a play that failed left it so; once it "
                 "serves, run serving.yml for it, or undrain it on the gateway (python -m dcu_serving.gateway.drained "
                 "undrain %s)" % (h, _drained_note(drained[h]), h)
                 for h in sorted(set(d["host"] for d in deployments if d["drained"]))]
    return {"gateway": gateway, "generated": generated, "ok": not problems and bool(deployments),
            "deployments": deployments, "problems": problems}


def _drained_note(entry):
    """"by serving.yml since 2026-12-02T06:01:02Z" for a drained-hosts entry, None for a host not drained."""
    if entry is None:
        return None
    since = entry.get("since")
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since)) if isinstance(since, (int, float)) else "?"
    return "by %s since %s" % (entry.get("reason") or "a play", when)


def _cell(value):
    return "-" if value in (None, "") else str(value).replace("|", "\\|")


def _table(head, rows, title=None):
    """A Markdown table, under a `## title` and followed by a blank line when titled."""
    lines = ["## " + title, ""] if title else []
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines.extend("| " + " | ".join(_cell(v) for v in row) + " |" for row in rows)
    return lines + ([""] if title else [])


def audit_gateway_lines(gateway):
    """One line per host and model, as verify.yml prints them."""
    return ["%s -> %s %s: %s through the gateway%s%s" % (
        gateway["gateway"], d["host"], d["model"], d["reached"],
        ", %s healthy behind its proxy" % d["healthy"] if d["healthy"] else "",
        " - DRAINED %s: no caller reaches it" % d["drained"] if d.get("drained") else
        "" if d["ok"] else " - NOT REACHED: %s" % (d["error"] or "no answer")) for d in gateway["deployments"]]


def audit_markdown(report):
    """A host's report, or the fleet's summary, as Markdown."""
    if "summary" in report:
        out = ["# Fleet audit", "", "%s of %s hosts without problems or drift (%s)." % (
            report["ok"], report["hosts"], _cell(report["generated"])), ""]
        out += _table(["host", "ok", "healthy", "driver", "DTK", "problems and drift"], [
            (s["host"], "yes" if s["ok"] else "**no**", s["healthy"], s["driver"], s["dtk"],
             "; ".join(s["problems"] + s["drift"])) for s in report["summary"]])
        gateway = report.get("gateway")
        if gateway:
            out += ["", "## Through the gateway", "",
                    "%s: %s of %s host and model pairs reached (%s)." % (
                        _cell(gateway["gateway"]), sum(1 for d in gateway["deployments"] if d["ok"]),
                        len(gateway["deployments"]), _cell(gateway["generated"])), ""]
            out += _table(["host", "model", "through the gateway", "healthy behind its proxy", "problem"], [
                (d["host"], d["model"], d["reached"] if d["ok"] else "**%s**" % d["reached"], d["healthy"],
                 "drained %s" % d["drained"] if d.get("drained") else d["error"]) for d in gateway["deployments"]])
        return "\n".join(out) + "\n"
    r = report
    out = ["# Audit of %s" % r["host"], "",
           "%s - %s healthy, %s (orid %s)." % ("**OK**" if r["ok"] else "**NOT OK**", r["healthy"],
                                               _cell(r["generated"]), _cell(r["orid"])), ""]
    if r["problems"] or r["drift"]:
        out += ["## Problems and drift", ""] + ["- %s" % line for line in r["problems"] + r["drift"]] + [""]
    d, t, h, p = r["driver"], r["dtk"], r["hyhal"], r["proxy"]
    out += _table(["part", "version", "bundle file", "sha256", "notes"], [
        ("driver", d["version"], d["file"], d["sha256"], "loaded %s %s; package %s" % (
            _cell(d["module"]), _cell(d["loaded_version"]), _cell(d["package"]))),
        ("DTK", t["version"], t["file"], t["sha256"],
         "active %s at %s" % (_cell(t["active_version"]), _cell(t["path"]))),
        ("hyhal", h["version"], h["file"], h["sha256"], "from %s, %s" % (h["from"], _cell(h["path"]))),
    ], "Host stack")
    cards = r["cards"]
    out += ["Cards: %s found (%s), %s expected." % (_cell(cards["found"]), _cell(cards["source"]),
                                                    _cell(cards["expected"])), ""]
    out += _table(["ref", "config digest", "bundle file", "sha256"], [
        (i["ref"], i["config_digest"], i["file"], i["sha256"]) for i in r["images"]], "Images")
    out += _table(["directory", "size (bytes)", "files", "config.json sha256", "weight index", "content sha256"], [
        (m["path"], m["size_bytes"], m["files"], m["config_sha256"], m["index"], m["content_sha256"])
        for m in r["models"]], "Model")
    remote = r.get("remote_code") or []
    out += ["Code from the model directory (trust_remote_code): %s." % (
        "; ".join("%s runs %s's, %s" % (_cell(c["unit"]), _cell(c["model"]), _cell(c["model_dir"])) for c in remote)
        if remote else "none runs"), ""]
    out += ["## Proxy", "", "dcu-serving %s; %s sha256 %s." % (_cell(p.get("version")), _cell(p.get("config")),
                                                               _cell(p.get("config_sha256"))), ""]
    out += _table(["unit", "state", "systemd", "restarts"], [
        (u["unit"], u["state"], "%s/%s" % (u["active"], u["sub"]), u["restarts"]) for u in r["units"]], "Units")
    out += ["## Device access", ""] + ["- %s: %s" % (a["user"], "opens every node" if a["ok"] else
                                                     "; ".join(a["problems"])) for a in r["device_access"]]
    return "\n".join(out) + "\n"


# The report directory on the controller: <host>.json/.md, gateway.json, fleet.json/.md.
def _write(path, text):
    """Replace path atomically: a reader never sees half a report."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix="." + os.path.basename(path))
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)


def read_gateway(report_dir):
    """What verify.yml's gateway play last found (gateway.json, which serving_audit writes given `gateway`), or None."""
    try:
        with open(os.path.join(report_dir, "gateway.json")) as handle:
            return json.load(handle)
    except (IOError, OSError, ValueError):
        return None


def _write_fleet(report_dir, hosts, generated):
    """fleet.json/.md from the reports of `hosts` in report_dir and gateway.json (the caller holds the lock)."""
    reports = []
    for host in hosts:
        try:
            with open(os.path.join(report_dir, host + ".json")) as handle:
                reports.append(json.load(handle))
        except (IOError, OSError, ValueError):
            pass  # not verified (yet): left out
    fleet = audit_fleet(reports, generated=generated, gateway=read_gateway(report_dir))
    _write(os.path.join(report_dir, "fleet.json"), json.dumps(fleet, indent=2, sort_keys=True) + "\n")
    _write(os.path.join(report_dir, "fleet.md"), audit_markdown(fleet))
    return [os.path.join(report_dir, "fleet.json"), os.path.join(report_dir, "fleet.md")]


def write_gateway(report_dir, gateway):
    """gateway.json, then fleet.json/.md with it, from the reports of the hosts the gateway reaches."""
    os.makedirs(report_dir, exist_ok=True)
    hosts = []
    for deployment in gateway.get("deployments") or []:
        if deployment.get("host") not in hosts:
            hosts.append(deployment.get("host"))
    with open(os.path.join(report_dir, ".fleet.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _write(os.path.join(report_dir, "gateway.json"), json.dumps(gateway, indent=2, sort_keys=True) + "\n")
        return [os.path.join(report_dir, "gateway.json"), *_write_fleet(report_dir, hosts, gateway.get("generated"))]


def write_reports(report_dir, report, hosts):
    """<host>.json/.md, then fleet.json/.md from the reports of `hosts` found in report_dir (under a lock:
    with forks, hosts finish at once). Returns the files written."""
    os.makedirs(report_dir, exist_ok=True)
    base = os.path.join(report_dir, report["host"])
    _write(base + ".json", json.dumps(report, indent=2, sort_keys=True) + "\n")
    _write(base + ".md", audit_markdown(report))
    with open(os.path.join(report_dir, ".fleet.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return [base + ".json", base + ".md", *_write_fleet(report_dir, hosts, report.get("generated"))]
