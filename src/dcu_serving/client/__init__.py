"""The standard client: the service contract compiled into code."""
