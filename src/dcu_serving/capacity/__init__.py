"""Capacity: load curves of a serving entrance (dcu-benchmark), measured with aiperf."""
