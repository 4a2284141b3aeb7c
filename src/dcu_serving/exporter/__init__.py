"""dcu-exporter: each DCU card's readings for Prometheus, one exporter per host (docs/operations.md, "Card metrics").

hy-smi runs when Prometheus scrapes (at most once per --min-interval, whatever the number of scrapers), its
rows are matched to sysfs's cards by PCI address (hy-smi's index is not PCI order), and each card carries the
service that runs on it. hy-smi's output is read by dcu_serving.hysmi, the collection's one parser
(plugins/module_utils/hysmi.py). It installs with the proxy's extra (prometheus-client).
"""
